"""Commands that profile and plan: ``profile``, ``plan``, ``planner-table``, ``schedule``.

Flags are checked before any work starts (``core.errors``' helpers, the dataclasses and the
file readers): a bad value or ``-o`` path costs no profiling or planning time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from core.collectives import Sync
from core.errors import UserInputError, require_int, require_output
from harness import systems
from harness.cli.app import app, console
from harness.cli.options import Device, Scale, Workload
from pipedream_impl.runtime import STAGE_EXECUTOR

__all__ = ["plan", "planner_table", "profile", "schedule"]


@app.command()
def schedule(
    config: Annotated[str | None, typer.Option(help="replicas per stage, e.g. 2-1-1 (not "
                                               "with --schedule-file)")] = None,
    system: Annotated[str, typer.Option(help="whose schedule: a system of our runtime ("
                                        + ", ".join(s.name for s in systems.SYSTEMS
                                                    if s.executor == STAGE_EXECUTOR)
                                        + ")")] = systems.PAPER["planned"],
    minibatches: Annotated[int, typer.Option(help="minibatches to schedule")] = 8,
    microbatches: Annotated[int | None, typer.Option(help="microbatched schedules (default "
                                                     "4 x stages)")] = None,
    weights: Annotated[str, typer.Option(help="stash, vertical-sync or none")] = "stash",
    in_flight: Annotated[int | None, typer.Option(help="default: per-stage warm-up (NOAM on "
                                                  "straight pipelines); 1 = model "
                                                  "parallelism")] = None,
    schedule_file: Annotated[str | None, typer.Option(
        help="read a schedule in torch.distributed.pipelining's compute-only CSV format "
             "(the custom schedule); the validator says what is wrong with a bad one")]
    = None,
    to_csv: Annotated[str | None, typer.Option(
        help="write one minibatch of the schedule in that CSV format (flush schedules)")]
    = None,
) -> None:
    """Print a schedule of our runtime: action lists and a worker x time grid."""
    from pipedream_impl.schedule import grid
    from pipedream_impl.schedule.torch_csv import order_of, write_csv

    require_output(to_csv, "--to-csv")
    sched = _schedule(system, config, minibatches, microbatches, weights, in_flight,
                      schedule_file)
    console.print(sched.text(), highlight=False, soft_wrap=True)
    console.print(grid(sched), highlight=False, soft_wrap=True)
    if to_csv:
        Path(to_csv).write_text(write_csv(order_of(sched)))
        console.print(f"wrote {to_csv}")


def _schedule(system: str, config: str | None, minibatches: int, microbatches: int | None,
              weights: str, in_flight: int | None, schedule_file: str | None):  # noqa: ANN202
    """The schedule ``pipebench schedule`` prints: a file's, or a system's on a layout."""
    from pipedream_impl.schedule import Layout
    from pipedream_impl.schedule import registry as schedules
    from pipedream_impl.schedule.compute_order import from_compute_order
    from pipedream_impl.schedule.torch_csv import microbatches_of, read_csv

    if schedule_file is not None:
        if config is not None:
            raise UserInputError("--schedule-file sets the layout (one row per rank); drop "
                                 "--config")
        order = read_csv(schedule_file)
        return from_compute_order(order, minibatches, microbatches or microbatches_of(order))
    if config is None:
        raise UserInputError("give --config (replicas per stage, e.g. 2-1-1) or "
                             "--schedule-file")
    sys_ = systems.get(system)
    if sys_.executor != STAGE_EXECUTOR or sys_.rules is None:
        raise UserInputError(f"--system {system} is not run by our runtime; choose one of "
                             + ", ".join(s.name for s in systems.SYSTEMS
                                         if s.executor == STAGE_EXECUTOR))
    layout = Layout.from_config(config)
    return schedules.build(sys_.schedule, layout, minibatches,
                           schedules.microbatches(sys_.schedule, len(layout.replicas),
                                                  microbatches),
                           weights, sys_.in_flight or in_flight)


@app.command()
def profile(
    workload: Workload,
    scale: Scale = "tiny",
    batch_size: Annotated[int | None, typer.Option(help="default: the workload's")] = None,
    steps: Annotated[int, typer.Option(help="timed repetitions (after warm-up)")] = 5,
    warmup: Annotated[int, typer.Option(help="untimed repetitions first")] = 2,
    device: Device = "auto",
    threads: Annotated[int, typer.Option(help="torch threads")] = 1,
    output: Annotated[str, typer.Option("-o", "--output", help=".json, or .txt for "
                                        "PipeDream's graph.txt")] = "profile.json",
) -> None:
    """Measure per-layer forward/backward time, activation bytes and parameter bytes."""
    require_int("--batch-size", batch_size)  # 0 would silently mean the default below
    require_int("--threads", threads)
    if device not in ("auto", "cpu", "cuda"):
        raise UserInputError(f"--device must be auto, cpu or cuda (got {device!r})")
    require_output(output)
    import torch

    from harness.experiments.training import resolve_device
    from harness.reporting.tracking import hardware
    from harness.reporting.units import fmt_bytes
    from pipedream_impl.profiling.profile import save_profile
    from pipedream_impl.profiling.profiler import profile_workload
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


_Bandwidth = Annotated[str | None, typer.Option(
    help="bytes/s per level, innermost first: 15.75GB/s,1.25GB/s")]
_Allreduce = Annotated[str, typer.Option(
    help="weight sync among machines: ring, ps, ps-colocated or byteps")]
_BatchSize = Annotated[int | None, typer.Option(
    help="samples per minibatch of the profile (for bytes per sample)")]


@app.command()
def plan(
    cluster: Annotated[str, typer.Option(help="A:4x4, B:2x8, C:4x1, 4x4 or 16")],
    profile_path: Annotated[str | None, typer.Option(
        "--profile", help="profile JSON or PipeDream graph.txt")] = None,
    workload: Annotated[str | None, typer.Option(help="profile this workload first")] = None,
    scale: Annotated[str, typer.Option(help="with --workload")] = "tiny",
    bandwidth: _Bandwidth = None,
    straight: Annotated[bool, typer.Option(help="no replication")] = False,
    memory_limit: Annotated[str | None, typer.Option(help="per worker, e.g. 16GB")] = None,
    cost_model: Annotated[str, typer.Option(help="pipebench or pipedream-2019")] = "pipebench",
    allreduce: _Allreduce = "ring",
    cpu_machines: Annotated[int, typer.Option(
        help="ps/byteps: CPU-only server machines (k)")] = 0,
    batch_size: _BatchSize = None,
    overlap: Annotated[bool, typer.Option(
        help="the backward hides the all-reduce, as the runtime and DDP run it (pipebench "
             "model); --no-overlap sums them, as the paper's model does")] = True,
    output: Annotated[str | None, typer.Option("-o", "--output", help="plan JSON")] = None,
    quiet: Annotated[bool, typer.Option(
        help="with -o, write the plan and print nothing")] = False,
) -> None:
    """Partition a model over a cluster with PipeDream's dynamic program."""
    from harness.reporting.plans import plan_table
    from harness.reporting.units import parse_bytes
    from pipedream_impl.planner.cluster import parse_cluster
    from pipedream_impl.planner.optimizer import COST_MODELS
    from pipedream_impl.planner.plan import plan_profile

    if cost_model not in COST_MODELS:
        raise UserInputError(f"unknown cost model {cost_model!r}; choose one of: "
                             f"{', '.join(COST_MODELS)}")
    if (profile_path is None) == (workload is None):
        raise UserInputError("give exactly one of --profile FILE or --workload NAME")
    require_int("--batch-size", batch_size)
    require_output(output)
    sync = Sync(allreduce, cpu_machines)
    if sync.mode != "ring" and cost_model != "pipebench":
        raise UserInputError(f"--allreduce {allreduce} needs --cost-model pipebench")
    clus = parse_cluster(cluster, bandwidth)
    limit = parse_bytes(memory_limit) if memory_limit is not None else None  # "16GB" -> bytes
    prof = _profile_to_plan(profile_path, workload, scale)
    result = plan_profile(prof, clus, cost_model, straight, limit, batch_size,
                          None if sync.mode == "ring" else sync, overlap)
    if not (quiet and output):  # without a file the table is the result
        console.print(plan_table(result))
    if output:
        Path(output).write_text(result.to_json())
        if not quiet:
            console.print(f"plan -> {output}")


def _profile_to_plan(profile_path: str | None, workload: str | None, scale: str):  # noqa: ANN202
    """``plan``'s profile: read from ``profile_path``, or measured on ``workload`` now."""
    from pipedream_impl.profiling.profile import load_profile

    if profile_path is not None:
        return load_profile(profile_path)
    import torch

    from harness.experiments.training import resolve_device
    from pipedream_impl.profiling.profiler import profile_workload
    from workloads import registry

    wl = registry.get(workload)
    torch.set_num_threads(1)
    return profile_workload(wl, scale, wl.spec(scale).batch_size, resolve_device("auto"))


@app.command("planner-table")
def planner_table(
    profiles: Annotated[str, typer.Option(help="folder of <model>/graph.txt")]
    = "../shared/pipedream-profiles",
    output: Annotated[str, typer.Option("-o", "--output")] = "results/planner.md",
) -> None:
    """Regenerate results/planner.md: our plans beside the paper's configurations."""
    from pathlib import Path

    from harness.reporting.plans import planner_markdown

    require_output(output)
    root = Path(profiles)
    if not (root / "vgg16" / "graph.txt").exists():
        raise UserInputError(f"{profiles}: expected <model>/graph.txt files (the PipeDream "
                             "profiles, e.g. ../shared/pipedream-profiles)")
    text = planner_markdown(root, f"pipebench planner-table --profiles {profiles} -o {output}")
    Path(output).write_text(text)
    console.print(text)


