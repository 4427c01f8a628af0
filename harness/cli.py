"""The ``pipebench`` command line: flags become dataclasses, library functions do the work.

Wrong input raises ``WorkloadError``; ``main`` prints its message as one line and exits 2.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from harness.bench import BENCH_SYSTEMS
from harness.compare import DEFAULT_SYSTEMS
from pipedream_impl.graph import GraphFormatError
from workloads.base import WorkloadError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark harness: PipeDream, GPipe and data parallelism side by side.")
console = Console()


@app.command()
def workloads() -> None:
    """List the workloads: scales, parameter counts, data, metric and target."""
    from harness.report import parameter_counts, workloads_table
    from workloads.registry import WORKLOADS

    ws = list(WORKLOADS.values())
    console.print(workloads_table(ws, {w.name: parameter_counts(w) for w in ws}))


@app.command()
def run(
    workload: Annotated[str, typer.Option("--workload", "-w", help="see `pipebench workloads`")],
    system: Annotated[str, typer.Option(help="training system")] = "single",
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
    recompute: Annotated[bool, typer.Option(help="gpipe: re-materialise activations")]
    = False,
    inject_failure: Annotated[str | None, typer.Option(hidden=True, help="RANK:MINIBATCH "
                                                       "(tests)")] = None,
) -> None:
    """Train a workload with one system until the target or the epoch budget."""
    from harness.config import RunConfig
    from harness.progress import Progress
    from harness.report import print_summary
    from harness.runner import run as run_system

    cfg = RunConfig(system=system, workload=workload, scale=scale, epochs=epochs, target=target,
                    data=data, batch_size=batch_size, lr=lr, seed=seed, threads=threads,
                    device=device, max_steps_per_epoch=max_steps, experiment=experiment,
                    workers=workers, plan=plan, config=config, weights=weights,
                    in_flight=in_flight, timeout_s=timeout, microbatches=microbatches,
                    recompute=recompute,
                    fail_at=tuple(int(x) for x in inject_failure.split(":"))
                    if inject_failure else None)
    summary = run_system(cfg, Progress(enabled=not quiet))
    print_summary(summary, console)


@app.command("compare-run")
def compare_run(
    workload: Annotated[str, typer.Option("--workload", "-w", help="see `pipebench workloads`")],
    workers: Annotated[int, typer.Option(help="workers of each multi-process system")] = 2,
    systems: Annotated[str, typer.Option(help="comma-separated systems, in run order")]
    = ",".join(DEFAULT_SYSTEMS),
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
    from rich.table import Table

    from harness.compare import COLUMNS, compare
    from harness.config import RunConfig
    from harness.progress import Progress

    names = tuple(s.strip() for s in systems.split(",") if s.strip())
    base = RunConfig(system="pipedream", workload=workload, scale=scale, epochs=epochs,
                     target=target, data=data, batch_size=batch_size, seed=seed,
                     threads=threads, device=device, max_steps_per_epoch=max_steps,
                     experiment=experiment, workers=workers, microbatches=microbatches)
    cmp = compare(base, names, Progress(enabled=not quiet), " ".join(["pipebench"] +
                                                                       sys.argv[1:]))
    table = Table(title=f"{cmp.workload} ({cmp.scale}), {cmp.workers} workers")
    for c in COLUMNS:
        table.add_column(c)
    for row in cmp.table():
        table.add_row(*row)
    Console(width=max(console.width, 180)).print(table)  # 11 columns: wider than 80
    console.print(f"MLflow parent run {cmp.parent_run_id} (children: one run per system)")
    if output:
        from pathlib import Path

        Path(output).write_text(cmp.markdown(" ".join(["pipebench"] + sys.argv[1:])))
        console.print(f"wrote {output}")
    if any(r.failed for r in cmp.rows):
        raise typer.Exit(1)


@app.command()
def bench(
    workload: Annotated[str, typer.Option("--workload", "-w", help="see `pipebench workloads`")]
    = "vgg16",
    workers: Annotated[int, typer.Option(help="workers (stages of the straight split)")] = 2,
    systems: Annotated[str, typer.Option(help="comma-separated systems")]
    = ",".join(BENCH_SYSTEMS),
    scale: Annotated[str, typer.Option(help="tiny, small or full")] = "tiny",
    steps: Annotated[int, typer.Option(help="flush minibatches per epoch (others: x M)")]
    = 12,
    epochs: Annotated[int, typer.Option(help="epochs (throughput: median)")] = 5,
    batch_size: Annotated[int | None, typer.Option(help="microbatch size b (default: the "
                                                   "workload's batch size)")] = None,
    microbatches: Annotated[int | None, typer.Option(help="flush pipelines' microbatches "
                                                     "(default 4 x stages)")] = None,
    threads: Annotated[int, typer.Option(help="torch threads per worker")] = 1,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    experiment: Annotated[str, typer.Option(help="MLflow experiment")] = "pipebench-bench",
    output: Annotated[str | None, typer.Option("--output", "-o", help="markdown file")]
    = None,
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
) -> None:
    """Throughput of every system at equal microbatch size on one split (recorded, not
    asserted)."""
    from harness import bench as bench_lib
    from harness.config import RunConfig
    from harness.progress import Progress

    base = RunConfig(system="pipedream", workload=workload, scale=scale, epochs=epochs,
                     batch_size=batch_size, threads=threads, device=device,
                     experiment=experiment, workers=workers, microbatches=microbatches)
    names = tuple(s.strip() for s in systems.split(",") if s.strip())
    rows = bench_lib.bench(base, names, steps, Progress(enabled=not quiet))
    text = bench_lib.markdown(rows, base, " ".join(["pipebench"] + sys.argv[1:]))
    _emit(text, output)


def _emit(text: str, output: str | None) -> None:
    """Print a generated markdown report and write it to ``output`` when given."""
    from pathlib import Path

    console.print(text)
    if output:
        Path(output).write_text(text)
        console.print(f"wrote {output}")


@app.command()
def simulate(
    profile_path: Annotated[str, typer.Option("--profile", help="profile JSON or PipeDream "
                                              "graph.txt")],
    cluster: Annotated[str, typer.Option(help="A:4x4, B:2x8, C:4x1, 4x4 or 16")] = "A:4x4",
    system: Annotated[str, typer.Option(help="pipedream, gpipe, mp or dp")] = "pipedream",
    config: Annotated[str | None, typer.Option(help="replicas per stage, e.g. 15-1")] = None,
    plan_path: Annotated[str | None, typer.Option("--plan", help="plan JSON")] = None,
    stages: Annotated[int | None, typer.Option(help="gpipe/mp: pipeline depth (default: "
                                               "all workers)")] = None,
    bandwidth: Annotated[str | None, typer.Option(help="bytes/s per level, innermost "
                                                  "first")] = None,
    minibatches: Annotated[int, typer.Option(help="minibatches to simulate")] = 256,
    microbatches: Annotated[int | None, typer.Option(help="gpipe (default 4 x stages)")]
    = None,
    compute_factor: Annotated[float, typer.Option(help="device speed relative to the "
                                                  "profiled one")] = 1.0,
    latency: Annotated[float, typer.Option(help="seconds per message")] = 0.0,
    allreduce: Annotated[str, typer.Option(help="ring or ps")] = "ring",
    dp_overlap: Annotated[bool, typer.Option(help="dp: all-reduce overlapped with the "
                                             "backward (DDP, Horovod)")] = True,
    gantt_path: Annotated[str | None, typer.Option("--gantt", help="timeline PNG")] = None,
) -> None:
    """Simulate a system on a modelled cluster from a profile (same schedules as the
    runtime); print time per minibatch, throughput, utilisation, bytes and memory."""
    from harness.report import fmt_bytes
    from harness.simulator import gantt, layout_for, simulate_system
    from pipedream_impl.cluster import parse_cluster
    from pipedream_impl.plan import Plan
    from pipedream_impl.profile import load_profile

    prof = load_profile(profile_path)
    cl = parse_cluster(cluster, bandwidth)
    plan_obj = Plan.from_json(open(plan_path).read()) if plan_path else None
    groups, replicas, placement, how = layout_for(prof, cl, system, config, plan_obj, stages)
    r = simulate_system(prof, cl, system, groups, replicas, placement, minibatches,
                        microbatches, compute_factor, latency, allreduce,
                        dp_overlap=dp_overlap)
    console.print(f"{system} {r.config} on {cl.describe()} ({how}); profile batch "
                  f"{r.batch_size}, {r.minibatches} minibatches simulated")
    console.print(f"time per minibatch {r.time_per_minibatch_s * 1e3:.2f} ms, throughput "
                  f"{r.throughput_samples_s:.1f} samples/s, bytes per sample "
                  f"{fmt_bytes(r.bytes_per_sample)}")
    for lv, b in sorted(r.bytes_per_level.items()):
        console.print(f"  level {lv} ({cl.levels[lv].bandwidth / 1e9:g} GB/s): "
                      f"{fmt_bytes(b / r.minibatches)} per minibatch")
    for rank, mem in r.peak_memory.items():
        console.print(f"  worker {rank}: utilisation {r.utilisation[rank]:.0%}, memory "
                      f"{fmt_bytes(mem['total'])} (weights+optimizer "
                      f"{fmt_bytes(mem['weights'])}, stashed {fmt_bytes(mem['stashed_weights'])}"
                      f", activations {fmt_bytes(mem['activations'])})")
    if gantt_path:
        gantt(r, gantt_path)
        console.print(f"wrote {gantt_path}")


@app.command()
def reproduce(
    table: Annotated[str, typer.Argument(help="table1, other-tasks, gpipe or validation")],
    profiles: Annotated[str | None, typer.Option(help="folder of PipeDream graph.txt "
                                                 "profiles, e.g. ../shared/pipedream-profiles")]
    = None,
    minibatches: Annotated[int, typer.Option(help="minibatches per simulation")] = 256,
    output: Annotated[str | None, typer.Option("--output", "-o", help="markdown file")]
    = None,
    workloads: Annotated[str, typer.Option(help="validation: workloads (tiny scale)")]
    = "vgg16,gnmt8",
    workers: Annotated[str, typer.Option(help="validation: worker counts")] = "1,2,4",
    systems: Annotated[str, typer.Option(help="validation: simulated systems")]
    = "pipedream,gpipe,mp,dp",
    steps: Annotated[int, typer.Option(help="validation: minibatches per epoch")] = 24,
    epochs: Annotated[int, typer.Option(help="validation: epochs per run")] = 3,
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
) -> None:
    """The PipeDream paper's tables beside our plans and simulations (table1, other-tasks,
    gpipe), or the simulator against runs on this machine (validation)."""
    from pathlib import Path

    from harness import reproduce as rp
    from harness.progress import Progress

    progress = Progress(enabled=not quiet)
    command = " ".join(["pipebench"] + sys.argv[1:])
    if table == "validation":
        from harness.validation import markdown, validate

        rows, machine = validate(tuple(workloads.split(",")),
                                 tuple(int(w) for w in workers.split(",")),
                                 tuple(systems.split(",")), steps, epochs,
                                 "pipebench-validation", progress)
        text = markdown(rows, machine, command)
    elif table in ("table1", "other-tasks"):
        rows = rp.table_rows(rp.TABLE1 if table == "table1" else rp.OTHER_TASKS,
                             rp.ProfileSource(profiles, progress), minibatches, progress)
        title = ("Table 1: speedup and communication vs data parallelism" if table == "table1"
                 else "Epoch time: PipeDream vs data parallelism on other tasks")
        text = rp.markdown(title, rp.TABLE_NOTE, rp.TABLE_COLUMNS, rows, command) \
            + rp.EXPLANATION
    elif table == "gpipe":
        rows = rp.gpipe_rows(rp.ProfileSource(profiles, progress), minibatches, progress)
        text = rp.markdown("PipeDream vs GPipe", rp.GPIPE_NOTE, rp.GPIPE_COLUMNS, rows,
                           command) + rp.GPIPE_EXPLANATION
    else:
        raise WorkloadError(f"unknown table {table!r}; choose table1, other-tasks, gpipe or "
                            "validation")
    if output and table in rp.PLOTS:
        png = str(Path(output).with_suffix(".png"))
        series, ylabel = rp.PLOTS[table]
        rp.plot(rows, series, ylabel, png, f"{table}: paper vs simulated")
        text += f"\n![paper vs simulated]({Path(png).name})\n"
    _emit(text, output)


@app.command()
def schedule(
    config: Annotated[str, typer.Option(help="replicas per stage, e.g. 2-1-1")],
    minibatches: Annotated[int, typer.Option(help="minibatches to schedule")] = 8,
    weights: Annotated[str, typer.Option(help="stash, vertical-sync or none")] = "stash",
    in_flight: Annotated[int | None, typer.Option(help="default NOAM; 1 = model "
                                                  "parallelism")] = None,
) -> None:
    """Print PipeDream's 1F1B(-RR) schedule: action lists and a worker x time grid."""
    from pipedream_impl.schedule import Layout, ScheduleError, grid, one_f_one_b

    try:
        sched = one_f_one_b(Layout.from_config(config), minibatches, weights, in_flight)
    except ScheduleError as e:
        raise WorkloadError(str(e)) from e
    console.print(sched.text(), highlight=False, soft_wrap=True)
    console.print(grid(sched), highlight=False, soft_wrap=True)


@app.command()
def profile(
    workload: Annotated[str, typer.Option("--workload", "-w")],
    scale: Annotated[str, typer.Option(help="tiny, small or full")] = "tiny",
    batch_size: Annotated[int | None, typer.Option(help="default: the workload's")] = None,
    steps: Annotated[int, typer.Option(help="timed repetitions (after warm-up)")] = 5,
    warmup: Annotated[int, typer.Option(help="untimed repetitions first")] = 2,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    threads: Annotated[int, typer.Option(help="torch threads")] = 1,
    output: Annotated[str, typer.Option("-o", "--output", help=".json, or .txt for "
                                        "PipeDream's graph.txt")] = "profile.json",
) -> None:
    """Measure per-layer forward/backward time, activation bytes and parameter bytes."""
    import torch

    from harness.report import fmt_bytes
    from harness.tracking import hardware
    from harness.training import resolve_device
    from pipedream_impl.profile import save_profile
    from pipedream_impl.profiler import profile_workload
    from workloads import registry

    wl = registry.get(workload)
    spec = wl.spec(scale)
    dev = resolve_device(device)
    torch.set_num_threads(threads)
    prof = profile_workload(wl, scale, batch_size or spec.batch_size, dev, warmup=warmup,
                            steps=steps, hardware=hardware(dev))
    save_profile(prof, output)
    total = sum(n.forward_ms + n.backward_ms for n in prof.layers)
    params = sum(n.parameter_bytes for n in prof.layers)
    console.print(f"{len(prof.layers)} layers of {wl.name}/{scale}, batch {prof.batch_size} "
                  f"on {dev}: {total:.2f} ms per forward+backward, {fmt_bytes(params)} of "
                  f"parameters -> {output}")


@app.command()
def plan(
    cluster: Annotated[str, typer.Option(help="A:4x4, B:2x8, C:4x1, 4x4 or 16")],
    profile_path: Annotated[str | None, typer.Option("--profile", help="profile JSON or "
                                                     "PipeDream graph.txt")] = None,
    workload: Annotated[str | None, typer.Option(help="profile this workload first")] = None,
    scale: Annotated[str, typer.Option(help="with --workload")] = "tiny",
    bandwidth: Annotated[str | None, typer.Option(help="bytes/s per level, innermost "
                                                  "first: 15.75GB/s,1.25GB/s")] = None,
    straight: Annotated[bool, typer.Option(help="no replication")] = False,
    memory_limit: Annotated[str | None, typer.Option(help="per worker, e.g. 16GB")] = None,
    cost_model: Annotated[str, typer.Option(help="pipebench or pipedream-2019")] = "pipebench",
    batch_size: Annotated[int | None, typer.Option(help="samples per minibatch of the "
                                                   "profile (for bytes per sample)")] = None,
    output: Annotated[str | None, typer.Option("-o", "--output", help="plan JSON")] = None,
) -> None:
    """Partition a model over a cluster with PipeDream's dynamic program."""
    from pathlib import Path

    from harness.planning import plan_table
    from pipedream_impl.cluster import parse_bandwidth, parse_cluster
    from pipedream_impl.optimizer import COST_MODELS
    from pipedream_impl.plan import plan_profile
    from pipedream_impl.profile import load_profile

    if cost_model not in COST_MODELS:
        raise WorkloadError(f"unknown cost model {cost_model!r}; choose one of: "
                            f"{', '.join(COST_MODELS)}")
    if (profile_path is None) == (workload is None):
        raise WorkloadError("give exactly one of --profile FILE or --workload NAME")
    if profile_path is not None:
        prof = load_profile(profile_path)
    else:
        import torch

        from harness.training import resolve_device
        from pipedream_impl.profiler import profile_workload
        from workloads import registry

        wl = registry.get(workload)
        torch.set_num_threads(1)
        prof = profile_workload(wl, scale, wl.spec(scale).batch_size, resolve_device("auto"))
    limit = parse_bandwidth(memory_limit) if memory_limit else None  # "16GB" -> bytes
    result = plan_profile(prof, parse_cluster(cluster, bandwidth), cost_model, straight, limit,
                          batch_size)
    console.print(plan_table(result))
    if output:
        Path(output).write_text(result.to_json())
        console.print(f"plan -> {output}")


@app.command("planner-table")
def planner_table(
    profiles: Annotated[str, typer.Option(help="folder of <model>/graph.txt")]
    = "../shared/pipedream-profiles",
    output: Annotated[str, typer.Option("-o", "--output")] = "results/planner.md",
) -> None:
    """Regenerate results/planner.md: our plans beside the paper's configurations."""
    from pathlib import Path

    from harness.planning import planner_markdown

    root = Path(profiles)
    if not (root / "vgg16" / "graph.txt").exists():
        raise WorkloadError(f"{profiles}: expected <model>/graph.txt files (the PipeDream "
                            "profiles, e.g. ../shared/pipedream-profiles)")
    text = planner_markdown(root, f"pipebench planner-table --profiles {profiles} -o {output}")
    Path(output).write_text(text)
    console.print(text)


def main() -> None:
    try:
        app(standalone_mode=False)
    except (WorkloadError, GraphFormatError) as e:
        Console(stderr=True).print(f"error: {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except RuntimeError as e:
        from harness.pipeline_system import PipelineFailure

        if not isinstance(e, PipelineFailure):
            raise
        Console(stderr=True).print(f"error: {e}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as e:  # click usage errors (unknown option, missing value)
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
