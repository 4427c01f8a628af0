"""Commands of the nightly benchmark and the dashboards: ``bench`` (a suite, or one ad-hoc
group), ``regressions``, ``compare`` (from the MLflow store) and ``dashboard``."""

from __future__ import annotations

from typing import Annotated

import typer

from harness import systems as system_registry
from harness.cli.app import app, command_line, console, emit

__all__ = ["bench"]


@app.command()
def bench(
    suite: Annotated[str | None, typer.Option(help="a suite: smoke, nightly, gpu or a TOML "
                                              "file (default: one ad-hoc group from the "
                                              "options below)")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="write the suite result "
                                                 "(schema pipebench-suite/1) here")] = None,
    repeats: Annotated[int | None, typer.Option(help="runs of every cell (default: the "
                                                "suite's; ad hoc 3)")] = None,
    workload: Annotated[str, typer.Option("--workload", "-w", help="ad hoc: see `pipebench "
                                          "workloads`")] = "vgg16",
    workers: Annotated[int, typer.Option(help="ad hoc: workers (stages of the straight "
                                         "split)")] = 2,
    systems: Annotated[str, typer.Option(help="ad hoc: comma-separated systems")]
    = ",".join(system_registry.names()),
    scale: Annotated[str, typer.Option(help="ad hoc: tiny, small or full")] = "tiny",
    steps: Annotated[int, typer.Option(help="ad hoc: flush minibatches per epoch (others: "
                                       "x M)")] = 12,
    epochs: Annotated[int, typer.Option(help="ad hoc: epochs (throughput: median)")] = 5,
    batch_size: Annotated[int | None, typer.Option(help="ad hoc: microbatch size b "
                                                   "(default: the workload's batch size)")]
    = None,
    microbatches: Annotated[int | None, typer.Option(help="ad hoc: flush pipelines' "
                                                     "microbatches (default 4 x stages)")]
    = None,
    threads: Annotated[int, typer.Option(help="ad hoc: torch threads per worker")] = 1,
    device: Annotated[str, typer.Option(help="ad hoc: auto, cpu or cuda")] = "auto",
    experiment: Annotated[str, typer.Option(help="MLflow experiment")] = "pipebench-suite",
    output: Annotated[str | None, typer.Option("--output", "-o", help="markdown report")]
    = None,
    quiet: Annotated[bool, typer.Option(help="no progress output")] = False,
) -> None:
    """Run a benchmark suite (repeated, systems interleaved; median and spread) and report
    it; the numbers are recorded, never asserted."""
    from core.errors import UserInputError
    from harness.experiments import bench as bench_lib
    from harness.experiments.suite import load_suite
    from harness.experiments.suite_run import run_suite
    from harness.reporting.progress import Progress
    from harness.reporting.results import write_result

    if repeats is not None and repeats < 1:
        raise UserInputError(f"--repeats must be at least 1 (got {repeats})")
    if suite:
        spec = load_suite(suite)
    else:
        names = tuple(s.strip() for s in systems.split(",") if s.strip())
        spec = bench_lib.adhoc_suite(workload, names, workers, scale, epochs, steps,
                                     repeats or 3, threads, device, batch_size, microbatches)
    result = run_suite(spec, Progress(enabled=not quiet), experiment, repeats)
    if json_out:
        write_result(result, json_out)
        console.print(f"wrote {json_out}")
    emit(bench_lib.markdown(result, command_line()), output)
    if result["mlflow"]:
        console.print(f"MLflow parent run {result['mlflow']['parent_run_id']} "
                      f"({result['mlflow']['tracking_uri']})", highlight=False)
