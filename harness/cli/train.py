"""Commands that train: ``workloads``, ``run``, ``compare-run`` (``bench`` and the suites:
``harness.cli.suites``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Annotated

import typer

from core.errors import UserInputError, require_output
from harness import systems
from harness.cli.app import app, command_line, console
from harness.cli.options import (
    Device,
    DryRun,
    Epochs,
    GpusPerNode,
    Launcher,
    MaxSteps,
    Nodes,
    Partition,
    Quiet,
    SbatchArg,
    Scale,
    Seed,
    TimeLimit,
    Workload,
)
from harness.cli.slurm import check_launcher, job_argv, submit_job
from harness.config import FailureOptions, PipelineOptions, RunConfig

__all__ = ["compare_run", "run", "workloads"]


@app.command()
def workloads() -> None:
    """List the workloads: scales, parameter counts, data, metric and target."""
    from harness.reporting.tables import parameter_counts, workloads_table
    from workloads.registry import WORKLOADS

    ws = list(WORKLOADS.values())
    console.print(workloads_table(ws, {w.name: parameter_counts(w) for w in ws}))


_RunWorkload = Annotated[str | None, typer.Option(
    "--workload", "-w", help="see `pipebench workloads` (required unless --resume)")]
_System = Annotated[str, typer.Option(help=", ".join(systems.names()))]
_WarmupSteps = Annotated[int, typer.Option(
    help="first minibatches of the run left out of throughput")]
_InFlight = Annotated[int | None, typer.Option(
    help="minibatches in flight (default: per-stage warm-up, NOAM on straight pipelines; "
         "1 = model parallelism)")]
_Microbatches = Annotated[int | None, typer.Option(
    help="gpipe: microbatches per minibatch (default 4 x stages)")]
_Recompute = Annotated[bool, typer.Option(
    help="re-materialise activations in the backward (schedules with no update between a "
         "minibatch's forward and backward)")]
_ScheduleFile = Annotated[str | None, typer.Option(
    help="--system custom / torch-custom: a schedule in torch.distributed.pipelining's "
         "compute-only CSV format (one row per rank, cells like 0F1, 1I0, 1W0)")]
_StageLr = Annotated[str | None, typer.Option(
    help="replicated stages' learning rate: replicas (default; PipeDream's rule: lr x "
         "replicas of the stage / replicas of stage 0) or same (one lr everywhere)")]
_StallTimeout = Annotated[float | None, typer.Option(
    help="end the run when a worker makes no progress for this many seconds "
         "(default: the workload's, per scale: tiny 20, small 60, full 300)")]
_CheckpointDir = Annotated[str | None, typer.Option(
    help="save checkpoints here (weights, optimizer, stashed versions, data position)")]
_Resume = Annotated[str | None, typer.Option(
    help="continue the run checkpointed in this directory (its settings; --epochs may "
         "extend it)")]
_InjectFault = Annotated[str | None, typer.Option(
    help="fault injection, off by default: KIND:RANK:ACTION or KIND:RANK:ACTION@EPOCH, "
         "KIND raise|kill|stall, e.g. kill:1:F3; or a straggler, slow:RANK:ACTION:FACTOR "
         "(every ACTION of RANK takes FACTOR times as long), e.g. slow:1:F:1.2")]


@app.command()
def run(
    workload: _RunWorkload = None,
    system: _System = systems.SYSTEMS[0].name,
    scale: Scale = RunConfig.scale,
    epochs: Epochs = None,
    target: Annotated[float | None, typer.Option(help="quality target (default: workload's)")]
    = None,
    data: Annotated[str | None, typer.Option(help="path of a real dataset (default: built-in)")]
    = None,
    batch_size: Annotated[int | None, typer.Option(help="minibatch size")] = None,
    lr: Annotated[float | None, typer.Option(help="learning rate (default: workload's)")] = None,
    seed: Seed = RunConfig.seed,
    threads: Annotated[int | None, typer.Option(help="torch threads per worker")] = None,
    device: Device = RunConfig.device,
    max_steps: MaxSteps = None,
    warmup_steps: _WarmupSteps = RunConfig.warmup_steps,
    experiment: Annotated[str, typer.Option(help="MLflow experiment")] = RunConfig.experiment,
    quiet: Quiet = False,
    workers: Annotated[int, typer.Option(help="worker processes (pipeline systems)")]
    = RunConfig.workers,
    plan: Annotated[str | None, typer.Option(help="plan JSON from `pipebench plan -o`")] = None,
    config: Annotated[str | None, typer.Option(help="replicas per stage, e.g. 2-1-1")] = None,
    weights: Annotated[str, typer.Option(help="stash, vertical-sync or none")]
    = PipelineOptions.weights,
    in_flight: _InFlight = None,
    timeout: Annotated[float, typer.Option(help="seconds any receive may wait")]
    = FailureOptions.timeout_s,
    microbatches: _Microbatches = None,
    recompute: _Recompute = False,
    schedule_file: _ScheduleFile = None,
    stage_lr: _StageLr = None,
    stall_timeout: _StallTimeout = None,
    checkpoint_dir: _CheckpointDir = None,
    checkpoint_every_epochs: Annotated[int, typer.Option(help="checkpoint period")]
    = FailureOptions.checkpoint_every_epochs,
    resume: _Resume = None,
    inject_fault: _InjectFault = None,
    launcher: Launcher = RunConfig.launcher,
    nodes: Nodes = 1,
    gpus_per_node: GpusPerNode = 0,
    partition: Partition = None,
    time_limit: TimeLimit = None,
    dry_run: DryRun = False,
    sbatch_arg: SbatchArg = None,
) -> None:
    """Train a workload with one system until the target or the epoch budget (here, or as
    a Slurm job: --launcher slurm)."""
    flags = SimpleNamespace(**locals())  # every option, by its parameter's name
    check_launcher(flags)
    cfg, ckpt = _resumed(flags) if resume is not None else (_run_config(flags), None)
    if launcher == "slurm":
        cpus = cfg.threads and cfg.threads * cfg.workers // nodes  # None: whole nodes
        return submit_job(f"pipebench-{cfg.system}-{cfg.workload}", [cfg.workers], cpus,
                          flags, job_argv("run", run, flags), quiet)
    _run_here(cfg.replace(launcher=launcher), ckpt, quiet)


def _run_here(cfg, ckpt, quiet: bool) -> None:  # noqa: ANN001 - a RunConfig, a Checkpoint
    """Run on this machine (or in a job's allocation) and print the summary."""
    _start_workers_server([cfg.worker_launcher()], cfg.workload)  # before the imports below
    from harness.experiments.runner import run as run_system
    from harness.reporting.progress import Progress
    from harness.reporting.tables import print_summary

    print_summary(run_system(cfg, Progress(enabled=not quiet), resume=ckpt), console)


def _start_workers_server(launchers: list[str | None], workload: str) -> None:
    """Where any of the runs to come forks its workers here (their launchers), start the
    fork server now, for ``workload``'s workers: its imports overlap this process's
    (``pipedream_impl.runtime.processes``)."""
    from pipedream_impl.runtime import SPAWN_LAUNCHER, processes

    if SPAWN_LAUNCHER in launchers:
        processes.start_server(workload)


def _run_config(f: SimpleNamespace):  # noqa: ANN202 - a harness.config.RunConfig
    """The settings of a new run from ``run``'s flags."""
    from pipedream_impl.runtime.faults import Fault

    if f.workload is None:
        raise UserInputError("--workload is required (or --resume DIR to continue a run)")
    return RunConfig.from_flags(
        system=f.system, workload=f.workload, scale=f.scale, epochs=f.epochs, target=f.target,
        data=f.data, batch_size=f.batch_size, lr=f.lr, seed=f.seed, threads=f.threads,
        device=f.device, max_steps_per_epoch=f.max_steps, experiment=f.experiment,
        warmup_steps=f.warmup_steps, workers=f.workers, plan=f.plan, config=f.config,
        weights=f.weights, in_flight=f.in_flight, timeout_s=f.timeout, microbatches=f.microbatches,
        recompute=f.recompute, schedule_file=f.schedule_file,
        stage_lr=f.stage_lr or PipelineOptions.stage_lr,
        fault=Fault.parse(f.inject_fault) if f.inject_fault else None,
        stall_timeout_s=f.stall_timeout, checkpoint_dir=f.checkpoint_dir,
        checkpoint_every_epochs=f.checkpoint_every_epochs)


def _resumed(f: SimpleNamespace) -> tuple:
    """The settings and checkpoint of the run ``--resume`` continues: its own settings, less
    what ``run``'s flags may change (--epochs, --stall-timeout, --checkpoint-dir)."""
    from harness.experiments import checkpoint

    given = [flag for flag, value in (("--workload", f.workload), ("--plan", f.plan),
                                      ("--config", f.config), ("--data", f.data),
                                      ("--inject-fault", f.inject_fault),
                                      ("--stage-lr", f.stage_lr),
                                      ("--schedule-file", f.schedule_file))
             if value is not None]
    if given:
        raise UserInputError(f"--resume continues the checkpoint's run with its own "
                             f"settings; drop {', '.join(given)} (only --epochs, "
                             f"--stall-timeout and --checkpoint-dir may change)")
    ckpt = checkpoint.load(f.resume)
    cfg = checkpoint.resume_config(ckpt, epochs=f.epochs, stall_timeout_s=f.stall_timeout,
                                   checkpoint_dir=f.checkpoint_dir or f.resume)
    return cfg, ckpt


@app.command("compare-run")
def compare_run(
    workload: Workload,
    workers: Annotated[int, typer.Option(help="workers of each multi-process system")] = 2,
    system_names: Annotated[str, typer.Option(
        "--systems", help="comma-separated systems, in run order",
        show_default="every system that needs no schedule file")]
    = ",".join(systems.names(systems.SELF_CONTAINED)),
    scale: Scale = RunConfig.scale,
    epochs: Epochs = None,
    target: Annotated[float | None, typer.Option(help="quality target")] = None,
    data: Annotated[str | None, typer.Option(help="path of a real dataset")] = None,
    batch_size: Annotated[int | None, typer.Option(help="global minibatch size")] = None,
    seed: Seed = RunConfig.seed,
    threads: Annotated[int | None, typer.Option(
        help="torch threads per worker (default cores / workers)")] = None,
    microbatches: Annotated[int | None, typer.Option(
        help="flush pipelines' microbatches (default 4 x stages)")] = None,
    max_steps: MaxSteps = None,
    device: Device = RunConfig.device,
    experiment: Annotated[str, typer.Option(help="MLflow experiment")] = RunConfig.experiment,
    output: Annotated[str | None, typer.Option(
        "--output", "-o", help="write the table as markdown here")] = None,
    quiet: Quiet = False,
) -> None:
    """Run several systems now, then tabulate them (see compare for runs already in the
    MLflow store).

    Every system runs on the same settings; the paper-style comparison table is printed,
    and the runs are one MLflow parent run with a child run per system."""
    from pathlib import Path

    require_output(output)
    names = tuple(s.strip() for s in system_names.split(",") if s.strip())
    if not names:
        raise UserInputError("--systems needs at least one system, e.g. pipedream,gpipe")
    base = RunConfig.from_flags(system=systems.PAPER["planned"], workload=workload, scale=scale,
                     epochs=epochs, target=target, data=data, batch_size=batch_size,
                     seed=seed, threads=threads, device=device, max_steps_per_epoch=max_steps,
                     experiment=experiment, workers=workers, microbatches=microbatches)
    _start_workers_server([systems.get(n).launcher for n in names], base.workload)
    from harness.experiments.compare import compare
    from harness.reporting.progress import Progress

    cmp = compare(base, names, Progress(enabled=not quiet), command_line())
    if output:
        Path(output).write_text(cmp.markdown(command_line()))
    if not (quiet and output):  # --quiet -o: the file is the result
        _print_comparison(cmp)
        console.print(f"MLflow parent run {cmp.parent_run_id} (children: one run per system)")
        if output:
            console.print(f"wrote {output}")
    if any(r.failed for r in cmp.rows):
        raise typer.Exit(1)


def _print_comparison(cmp) -> None:  # noqa: ANN001 - a harness.experiments.compare.Comparison
    """The comparison as a table, wider than the terminal if need be (11 columns)."""
    from rich.console import Console
    from rich.table import Table

    from harness.experiments.compare import COLUMNS

    table = Table(title=f"{cmp.workload} ({cmp.scale}), {cmp.workers} workers")
    for c in COLUMNS:
        table.add_column(c)
    for row in cmp.table():
        table.add_row(*row)
    Console(width=max(console.width, 180)).print(table)
