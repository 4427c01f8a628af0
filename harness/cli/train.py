"""Commands that train: ``workloads``, ``run``, ``compare-run`` (``bench`` and the suites:
``harness.cli.suites``)."""

from __future__ import annotations

from typing import Annotated

import typer

from core.errors import UserInputError, require_output
from harness import systems as system_registry
from harness.cli.app import app, command_line, console

__all__ = ["compare_run", "run", "workloads"]


@app.command()
def workloads() -> None:
    """List the workloads: scales, parameter counts, data, metric and target."""
    from harness.reporting.tables import parameter_counts, workloads_table
    from workloads.registry import WORKLOADS

    ws = list(WORKLOADS.values())
    console.print(workloads_table(ws, {w.name: parameter_counts(w) for w in ws}))


@app.command()
def run(
    workload: Annotated[str | None, typer.Option("--workload", "-w", help="see `pipebench "
                                                 "workloads` (required unless --resume)")]
    = None,
    system: Annotated[str, typer.Option(help=", ".join(system_registry.names()))]
    = system_registry.SYSTEMS[0].name,
    scale: Annotated[str, typer.Option(help="tiny, small or full")] = "tiny",
    epochs: Annotated[int | None, typer.Option(help="epoch budget (default: workload's)")]
    = None,
    target: Annotated[float | None, typer.Option(help="quality target (default: workload's)")]
    = None,
    data: Annotated[str | None, typer.Option(help="path of a real dataset (default: built-in)")]
    = None,
    batch_size: Annotated[int | None, typer.Option(help="minibatch size")] = None,
    lr: Annotated[float | None, typer.Option(help="learning rate (default: workload's)")] = None,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    threads: Annotated[int | None, typer.Option(help="torch threads per worker")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    max_steps: Annotated[int | None, typer.Option(help="cap on steps per epoch")] = None,
    warmup_steps: Annotated[int, typer.Option(help="first minibatches of the run left out "
                                              "of throughput")] = 2,
    experiment: Annotated[str, typer.Option(help="MLflow experiment")] = "pipebench",
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
    workers: Annotated[int, typer.Option(help="worker processes (pipeline systems)")] = 1,
    plan: Annotated[str | None, typer.Option(help="plan JSON from `pipebench plan -o`")]
    = None,
    config: Annotated[str | None, typer.Option(help="replicas per stage, e.g. 2-1-1")] = None,
    weights: Annotated[str, typer.Option(help="stash, vertical-sync or none")] = "stash",
    in_flight: Annotated[int | None, typer.Option(help="minibatches in flight (default "
                                                  "NOAM; 1 = model parallelism)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds any receive may wait")] = 120.0,
    microbatches: Annotated[int | None, typer.Option(help="gpipe: microbatches per "
                                                     "minibatch (default 4 x stages)")] = None,
    recompute: Annotated[bool, typer.Option(help="re-materialise activations in the backward "
                                            "(schedules with no update between a "
                                            "minibatch's forward and backward)")]
    = False,
    schedule_file: Annotated[str | None, typer.Option(
        help="--system custom / torch-custom: a schedule in torch.distributed.pipelining's "
             "compute-only CSV format (one row per rank, cells like 0F1, 1I0, 1W0)")] = None,
    stage_lr: Annotated[str | None, typer.Option(
        help="replicated stages' learning rate: replicas (default; PipeDream's rule: lr x "
             "replicas of the stage / replicas of stage 0) or same (one lr everywhere)")]
    = None,
    stall_timeout: Annotated[float | None, typer.Option(
        help="end the run when a worker makes no progress for this many seconds "
             "(default: the workload's, per scale: tiny 20, small 60, full 300)")] = None,
    checkpoint_dir: Annotated[str | None, typer.Option(
        help="save checkpoints here (weights, optimizer, stashed versions, data position)")]
    = None,
    checkpoint_every_epochs: Annotated[int, typer.Option(help="checkpoint period")] = 1,
    resume: Annotated[str | None, typer.Option(
        help="continue the run checkpointed in this directory (its settings; --epochs may "
             "extend it)")] = None,
    inject_fault: Annotated[str | None, typer.Option(
        help="fault injection for tests, off by default: KIND:RANK:ACTION or "
             "KIND:RANK:ACTION@EPOCH, KIND raise|kill|stall, e.g. kill:1:F3")] = None,
) -> None:
    """Train a workload with one system until the target or the epoch budget."""
    from harness.config import RunConfig
    from harness.experiments import checkpoint
    from harness.experiments.runner import run as run_system
    from harness.reporting.progress import Progress
    from harness.reporting.tables import print_summary
    from pipedream_impl.runtime.faults import Fault

    ckpt = None
    if resume is not None:
        given = [flag for flag, value in (("--workload", workload), ("--plan", plan),
                                          ("--config", config), ("--data", data),
                                          ("--inject-fault", inject_fault),
                                          ("--stage-lr", stage_lr),
                                          ("--schedule-file", schedule_file))
                 if value is not None]
        if given:
            raise UserInputError(f"--resume continues the checkpoint's run with its own "
                                 f"settings; drop {', '.join(given)} (only --epochs, "
                                 f"--stall-timeout and --checkpoint-dir may change)")
        ckpt = checkpoint.load(resume)
        cfg = checkpoint.resume_config(ckpt, epochs=epochs, stall_timeout_s=stall_timeout,
                                       checkpoint_dir=checkpoint_dir or resume)
    elif workload is None:
        raise UserInputError("--workload is required (or --resume DIR to continue a run)")
    else:
        cfg = RunConfig(system=system, workload=workload, scale=scale, epochs=epochs,
                        target=target, data=data, batch_size=batch_size, lr=lr, seed=seed,
                        threads=threads, device=device, max_steps_per_epoch=max_steps,
                        experiment=experiment, warmup_steps=warmup_steps, workers=workers,
                        plan=plan, config=config, weights=weights, in_flight=in_flight,
                        timeout_s=timeout, microbatches=microbatches, recompute=recompute,
                        schedule_file=schedule_file, stage_lr=stage_lr or "replicas",
                        fault=Fault.parse(inject_fault) if inject_fault else None,
                        stall_timeout_s=stall_timeout, checkpoint_dir=checkpoint_dir,
                        checkpoint_every_epochs=checkpoint_every_epochs)
    summary = run_system(cfg, Progress(enabled=not quiet), resume=ckpt)
    print_summary(summary, console)


@app.command("compare-run")
def compare_run(
    workload: Annotated[str, typer.Option("--workload", "-w", help="see `pipebench workloads`")],
    workers: Annotated[int, typer.Option(help="workers of each multi-process system")] = 2,
    systems: Annotated[str, typer.Option(help="comma-separated systems, in run order")]
    = ",".join(system_registry.names(system_registry.SELF_CONTAINED)),
    scale: Annotated[str, typer.Option(help="tiny, small or full")] = "tiny",
    epochs: Annotated[int | None, typer.Option(help="epoch budget (default: workload's)")]
    = None,
    target: Annotated[float | None, typer.Option(help="quality target")] = None,
    data: Annotated[str | None, typer.Option(help="path of a real dataset")] = None,
    batch_size: Annotated[int | None, typer.Option(help="global minibatch size")] = None,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    threads: Annotated[int | None, typer.Option(help="torch threads per worker "
                                                "(default cores / workers)")] = None,
    microbatches: Annotated[int | None, typer.Option(help="flush pipelines' microbatches "
                                                     "(default 4 x stages)")] = None,
    max_steps: Annotated[int | None, typer.Option(help="cap on steps per epoch")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    experiment: Annotated[str, typer.Option(help="MLflow experiment")] = "pipebench",
    output: Annotated[str | None, typer.Option("--output", "-o", help="write the table "
                                               "as markdown here")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
) -> None:
    """Run several systems on the same settings; print the paper-style comparison table."""
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from harness.config import RunConfig
    from harness.experiments.compare import COLUMNS, compare
    from harness.reporting.progress import Progress

    require_output(output)
    names = tuple(s.strip() for s in systems.split(",") if s.strip())
    if not names:
        raise UserInputError("--systems needs at least one system, e.g. pipedream,gpipe")
    base = RunConfig(system=system_registry.PAPER["planned"], workload=workload,
                     scale=scale, epochs=epochs,
                     target=target, data=data, batch_size=batch_size, seed=seed,
                     threads=threads, device=device, max_steps_per_epoch=max_steps,
                     experiment=experiment, workers=workers, microbatches=microbatches)
    cmp = compare(base, names, Progress(enabled=not quiet), command_line())
    table = Table(title=f"{cmp.workload} ({cmp.scale}), {cmp.workers} workers")
    for c in COLUMNS:
        table.add_column(c)
    for row in cmp.table():
        table.add_row(*row)
    Console(width=max(console.width, 180)).print(table)  # 11 columns: wider than 80
    console.print(f"MLflow parent run {cmp.parent_run_id} (children: one run per system)")
    if output:
        Path(output).write_text(cmp.markdown(command_line()))
        console.print(f"wrote {output}")
    if any(r.failed for r in cmp.rows):
        raise typer.Exit(1)
