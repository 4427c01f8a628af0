"""Commands of the nightly benchmark and the dashboards: ``bench`` (a suite, or one ad-hoc
group), ``compare`` (from the MLflow store) and ``dashboard`` (``regressions``, which judges
suite results: ``judging``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import typer

from core.errors import UserInputError, require_int, require_output
from harness import systems
from harness.cli.app import app, command_line, console, emit
from harness.cli.options import (
    DryRun,
    GpusPerNode,
    Launcher,
    Nodes,
    Output,
    Partition,
    Quiet,
    SbatchArg,
    TimeLimit,
)
from harness.cli.slurm import check_launcher, job_argv, submit_job
from pipedream_impl.runtime import LAUNCHERS

__all__ = ["bench", "check_cells", "compare", "dashboard"]


_Suite = Annotated[str | None, typer.Option(
    help="a suite: smoke, nightly, gpu or a TOML file (default: one ad-hoc group from the "
         "options below)")]
_JsonOut = Annotated[str | None, typer.Option(
    "--json", help="write the suite result (schema pipebench-suite/1) here")]
_Repeats = Annotated[int | None, typer.Option(
    help="runs of every cell (default: the suite's; ad hoc 3)")]
_Systems = Annotated[str, typer.Option("--systems", help="ad hoc: comma-separated systems",
                                       show_default="every system that needs no schedule "
                                                    "file")]
_BatchSize = Annotated[int | None, typer.Option(
    help="ad hoc: microbatch size b (default: the workload's batch size)")]
_Microbatches = Annotated[int | None, typer.Option(
    help="ad hoc: flush pipelines' microbatches (default 4 x stages)")]
_Render = Annotated[str | None, typer.Option(help="write the report of a suite result "
                                             "already run (its JSON); run nothing")]
_Plant = Annotated[list[str] | None, typer.Option(
    help="a planted regression, to measure the detector: SYSTEM=FAULT, e.g. "
         "pipedream=slow:*:*:1.1 (every compute action of every rank of pipedream's runs "
         "takes 1.1x as long); repeat it to plant several systems; recorded in the result")]


def planted(texts: list[str] | None) -> dict:
    """``--plant SYSTEM=FAULT`` (each given) as {system: Fault} (empty without one)."""
    from pipedream_impl.runtime.faults import Fault

    out = {}
    for text in texts or ():
        name, sep, fault = text.partition("=")
        if not sep:
            raise UserInputError(f"--plant {text!r}: expected SYSTEM=FAULT, e.g. "
                                 "pipedream=slow:*:*:1.1")
        system = systems.get(name.strip()).name
        if system in out:
            raise UserInputError(f"--plant {text!r}: {system} is planted twice")
        out[system] = Fault.parse(fault)
    return out


@app.command()
def bench(
    suite: _Suite = None,
    json_out: _JsonOut = None,
    repeats: _Repeats = None,
    workload: Annotated[str, typer.Option(
        "--workload", "-w", help="ad hoc: see `pipebench workloads`")] = "vgg16",
    workers: Annotated[int, typer.Option(
        help="ad hoc: workers (stages of the straight split)")] = 2,
    system_names: _Systems = ",".join(systems.names(systems.SELF_CONTAINED)),
    scale: Annotated[str, typer.Option(help="ad hoc: tiny, small or full")] = "tiny",
    steps: Annotated[int, typer.Option(
        help="ad hoc: flush minibatches per epoch (others: x M)")] = 12,
    epochs: Annotated[int, typer.Option(help="ad hoc: epochs (throughput: median)")] = 5,
    batch_size: _BatchSize = None,
    microbatches: _Microbatches = None,
    threads: Annotated[int, typer.Option(help="ad hoc: torch threads per worker")] = 1,
    device: Annotated[str, typer.Option(help="ad hoc: auto, cpu or cuda")] = "auto",
    experiment: Annotated[str, typer.Option(help="MLflow experiment")] = "pipebench-suite",
    plant: _Plant = None,
    render: _Render = None,
    output: Output = None,
    quiet: Quiet = False,
    launcher: Launcher = LAUNCHERS[0],
    nodes: Nodes = 1,
    gpus_per_node: GpusPerNode = 0,
    partition: Partition = None,
    time_limit: TimeLimit = None,
    dry_run: DryRun = False,
    sbatch_arg: SbatchArg = None,
) -> None:
    """Run a benchmark suite (repeated, systems interleaved; median and spread) and report it.

    The numbers are recorded, never asserted. --launcher slurm runs the whole suite as one
    Slurm job (its cells one after another on the same nodes)."""
    flags = SimpleNamespace(**locals())  # every option, by its parameter's name
    from harness.experiments import bench as bench_lib
    from harness.experiments.suite_run import run_suite
    from harness.reporting.progress import Progress
    from harness.reporting.results import write_result

    if render:  # the report of a result already run
        return _render(flags)
    check_launcher(flags)
    require_output(json_out, "--json")
    require_output(output)
    plants = planted(plant)
    spec = _suite(flags)
    check_cells(spec)
    if launcher == "slurm":  # CPUs per node: a one-process cell's threads of all workers
        spread = [c.workers for c in spec.cells if systems.get(c.system).multi_process]
        submit_job(f"pipebench-bench-{spec.name}", spread or [1],
                   spec.threads * max(c.workers for c in spec.cells), flags,
                   job_argv("bench", bench, flags), quiet)
        return
    result = run_suite(spec, Progress(enabled=not quiet), experiment, repeats, plants,
                       launcher, command_line())
    if json_out:
        write_result(result, json_out)
    emit(bench_lib.markdown(result), output, quiet)
    _where(result, json_out, quiet)


def _render(f: SimpleNamespace) -> None:
    """``bench --render``: the report of a suite result already run, at today's code (its
    rule's level per metric, for one); nothing runs."""
    from harness.experiments import bench as bench_lib
    from harness.reporting.results import load_result

    if f.suite or f.json_out or f.plant or f.repeats is not None:
        raise UserInputError("--render writes the report of a suite result already run: "
                             "give no --suite, --json, --plant or --repeats with it")
    require_output(f.output)
    emit(bench_lib.markdown(load_result(f.render), command_line()), f.output, f.quiet)


def _where(result: dict, json_out: str | None, quiet: bool) -> None:
    """bench's closing lines: where the result went (none with --quiet)."""
    if quiet:
        return
    if json_out:
        console.print(f"wrote {json_out}")
    if result["mlflow"]:
        console.print(f"MLflow parent run {result['mlflow']['parent_run_id']} "
                      f"({result['mlflow']['tracking_uri']})", highlight=False)


def _suite(f: SimpleNamespace):  # noqa: ANN202 - a harness.experiments.suite.Suite
    """``--suite``'s suite, else the ad-hoc group ``bench``'s options describe."""
    from harness.experiments import bench as bench_lib
    from harness.experiments.suite import load_suite

    if f.repeats is not None and f.repeats < 1:
        raise UserInputError(f"--repeats must be at least 1 (got {f.repeats})")
    if f.suite:
        return load_suite(f.suite)
    names = tuple(s.strip() for s in f.system_names.split(",") if s.strip())
    if not names:
        raise UserInputError("--systems needs at least one system, e.g. pipedream,gpipe")
    return bench_lib.adhoc_suite(f.workload, names, f.workers, f.scale, f.epochs, f.steps,
                                 f.repeats or 3, f.threads, f.device, f.batch_size,
                                 f.microbatches)


def check_cells(spec) -> None:  # noqa: ANN001 - a harness.experiments.suite.Suite
    """Every cell's settings as its runs will use them (a RunConfig each, less the plan the
    suite computes on the way), before the suite's MLflow run or any worker starts."""
    from harness.config import RunConfig
    from harness.experiments.layout import check_run
    from harness.experiments.training import resolve_device
    from workloads import registry

    for c in spec.cells:
        require_int("--epochs", c.epochs)
        require_int("--steps", c.steps)
        batch = c.batch_size or registry.get(c.workload).spec(c.scale).batch_size
        if c.workers > 1:  # a missing committed layout profile: said before anything runs
            spec.layout_profile(c.workload, c.scale, batch, resolve_device(spec.device).type)
        one = not systems.get(c.system).multi_process
        check_run(RunConfig.from_flags(
            system=c.system, workload=c.workload, scale=c.scale, epochs=c.epochs,
            batch_size=c.batch_size, threads=spec.threads, device=spec.device,
            workers=1 if one else c.workers, max_steps_per_epoch=c.steps,
            microbatches=c.microbatches))


@app.command()
def compare(
    experiment: Annotated[str | None, typer.Option(
        help="MLflow experiment (default: the one holding the newest training run, suites "
             "included)")] = None,
    filter_string: Annotated[str, typer.Option(
        "--filter", help="MLflow search filter, e.g. \"params.workload = 'vgg16'\"")] = "",
    fmt: Annotated[str, typer.Option("--format", help="md, csv or json")] = "md",
    output: Annotated[str | None, typer.Option("--output", "-o", help="write here")] = None,
) -> None:
    """Tabulate runs already in the MLflow store (see compare-run to run systems first).

    The comparison table of the training runs of one experiment; nothing is re-run. With
    no --experiment, the experiment of the newest training run (a line on stderr names it):
    the runs just made by run, compare-run or bench."""
    from harness.reporting.store import compare_records, search_runs

    if fmt not in ("md", "csv", "json"):
        raise UserInputError(f"--format must be md, csv or json (got {fmt!r})")
    require_output(output)
    experiment = experiment or _newest_experiment()
    records = compare_records(search_runs(experiment, filter_string))
    text = _compare_text(records, fmt, experiment, filter_string)
    if output:
        from pathlib import Path

        Path(output).write_text(text)
        console.print(f"wrote {output}")
    else:
        typer.echo(text, nl=False)


def _newest_experiment() -> str:
    """The experiment of the newest training run, said in one line on stderr."""
    from rich.console import Console

    from harness.reporting.newest import newest_experiment
    from harness.reporting.tracking import default_tracking_uri

    name = newest_experiment()
    if name is None:
        raise UserInputError(f"no training runs in {default_tracking_uri()} (run, compare-run "
                             f"and bench make them)")
    Console(stderr=True).print(f"experiment {name!r}: the newest training run's "
                               f"(--experiment to choose another)", highlight=False,
                               markup=False, soft_wrap=True)
    return name


def _compare_text(records: list[dict], fmt: str, experiment: str, filter_string: str) -> str:
    """The records of ``compare`` as markdown (a titled table), CSV or JSON."""
    import csv
    import io
    import json

    from core.markdown import markdown_table
    from harness.reporting.store import COMPARE_COLUMNS, compare_rows

    if fmt == "json":
        return json.dumps(records, indent=1) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(records[0]) if records else ["run_id"])
        writer.writeheader()
        writer.writerows(records)
        return buf.getvalue()
    title = f"# Runs in {experiment}" + (f" where {filter_string}" if filter_string else "")
    return "\n".join([title, ""] + markdown_table(COMPARE_COLUMNS, compare_rows(records))) + "\n"


@app.command()
def dashboard(
    output: Annotated[str, typer.Option("--output", "-o", help="the HTML file to write")]
    = "report.html",
    experiment: Annotated[str, typer.Option(help="MLflow experiment of the suites")]
    = "pipebench-suite",
    suite: Annotated[str | None, typer.Option(help="which suite (default: the newest "
                                              "suite run's)")] = None,
    history: Annotated[int, typer.Option(help="results of the suite to show in its history")]
    = 30,  # harness.reporting.dashboard.HISTORY (kept literal: the CLI imports it lazily)
    json_in: Annotated[list[str] | None, typer.Option("--json", help="build from these "
                                                      "suite result files instead of the "
                                                      "store (oldest first; repeatable)")]
    = None,
    history_dir: Annotated[str | None, typer.Option(
        help="build from the suite result files in this directory instead of the store: "
             "the newest (of --suite) and its history there")] = None,
) -> None:
    """One self-contained, interactive HTML page of a suite, from the store or result files.

    Each throughput cell over the nights with its band of normal noise and the nights
    flagged, time-to-accuracy curves of the cells that train to a target, throughput, bytes
    per sample, memory and bubble per worker, per-worker timelines; hover for values and
    run ids, filter by workload or system (plotly.js embedded: works offline). Each suite
    run also logs its page to MLflow as dashboard.html."""
    from harness.cli.judging import check_dir
    from harness.reporting.dashboard import build_dashboard
    from harness.reporting.results import load_result
    from harness.reporting.store import dir_history, store_history

    if history < 1:
        raise UserInputError(f"--history must be at least 1 (got {history})")
    require_output(output)
    if json_in and history_dir is not None:
        raise UserInputError("give --json FILE ... or --history-dir DIR, not both")
    if json_in:
        results = [load_result(p) for p in json_in]
    elif history_dir is not None:
        check_dir(history_dir)
        results = dir_history(history_dir, suite, history)
    else:
        results = store_history(experiment, suite, history)
    Path(output).write_text(build_dashboard(results))
    console.print(f"wrote {output} ({len(results)} suite result(s))", highlight=False)
