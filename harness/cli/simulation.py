"""Commands that simulate: ``simulate`` and ``reproduce`` (the paper's tables, validation)."""

from __future__ import annotations

from typing import Annotated

import typer

from core.errors import UserInputError, parse_ints, require_int, require_output
from harness import systems
from harness.cli.app import app, command_line, console, emit
from harness.cli.options import Quiet

__all__ = ["reproduce", "simulate"]


_Profile = Annotated[str, typer.Option("--profile", help="profile JSON or PipeDream graph.txt")]
_Cluster = Annotated[str, typer.Option(help="A:4x4, B:2x8, C:4x1, 4x4 or 16")]
_System = Annotated[str, typer.Option(help=", ".join(
    n for s in systems.SIMULATED for n in (s.name, *s.aliases)))]
_Stages = Annotated[int | None, typer.Option(
    help="straight pipelines (gpipe, mp, ...): depth (default: all workers)")]
_Microbatches = Annotated[int | None, typer.Option(
    help="microbatched pipelines (default 4 x stages)")]
_Allreduce = Annotated[str, typer.Option(
    help="weight sync among machines: ring, ps, ps-colocated or byteps")]
_DpOverlap = Annotated[bool, typer.Option(
    help="dp: all-reduce overlapped with the backward (DDP, Horovod)")]
_ScheduleFile = Annotated[str | None, typer.Option(
    help="--system custom / torch-custom: a schedule in torch.distributed.pipelining's "
         "compute-only CSV format, one stage per rank (its rows set --stages and its "
         "microbatches --microbatches)")]


@app.command()
def simulate(
    profile_path: _Profile,
    cluster: _Cluster = "A:4x4",
    system: _System = systems.PAPER["planned"],
    config: Annotated[str | None, typer.Option(help="replicas per stage, e.g. 15-1")] = None,
    plan_path: Annotated[str | None, typer.Option("--plan", help="plan JSON")] = None,
    stages: _Stages = None,
    bandwidth: Annotated[str | None, typer.Option(
        help="bytes/s per level, innermost first")] = None,
    minibatches: Annotated[int, typer.Option(help="minibatches to simulate")] = 256,
    microbatches: _Microbatches = None,
    compute_factor: Annotated[float, typer.Option(
        help="device speed relative to the profiled one")] = 1.0,
    latency: Annotated[float, typer.Option(help="seconds per message")] = 0.0,
    allreduce: _Allreduce = "ring",
    cpu_machines: Annotated[int, typer.Option(
        help="ps/byteps: CPU-only server machines (k)")] = 0,
    dp_overlap: _DpOverlap = True,
    gantt_path: Annotated[str | None, typer.Option("--gantt", help="timeline PNG")] = None,
    schedule_file: _ScheduleFile = None,
) -> None:
    """Simulate a system on a modelled cluster from a profile (same schedules as the
    runtime).

    Prints time per minibatch, throughput, utilisation, bytes and memory."""
    from harness.sim.simulator import SimOptions, gantt, layout_for, simulate_system
    from pipedream_impl.planner.cluster import parse_cluster
    from pipedream_impl.planner.plan import load_plan
    from pipedream_impl.profiling.profile import load_profile

    order = None
    if schedule_file is not None:
        from pipedream_impl.schedule.torch_csv import microbatches_of, read_csv

        order = tuple(tuple(row) for row in read_csv(schedule_file))
        stages, microbatches = len(order), microbatches_of(order)
    options = SimOptions(minibatches=minibatches, microbatches=microbatches, order=order,
                         compute_factor=compute_factor, latency_s=latency,
                         allreduce=allreduce, cpu_machines=cpu_machines,
                         dp_overlap=dp_overlap)
    require_output(gantt_path, "--gantt")
    systems.simulated(system)  # an unknown name: before reading any file
    prof = load_profile(profile_path)
    cl = parse_cluster(cluster, bandwidth)
    plan_obj = load_plan(plan_path) if plan_path else None
    layout = layout_for(prof, cl, system, config, plan_obj, stages)
    r = simulate_system(prof, cl, system, layout, options)
    _print_simulation(r, cl, system, layout.how)
    if gantt_path:
        gantt(r, gantt_path)
        console.print(f"wrote {gantt_path}")


def _print_simulation(r, cl, system: str, how: str) -> None:  # noqa: ANN001
    """``simulate``'s report: a simulation result ``r`` on cluster ``cl``."""
    from harness.reporting.units import fmt_bytes

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
                      f", activations {fmt_bytes(mem['activations'])}; "
                      f"{mem['weight_versions']} weight version(s))")


_TABLES = ("table1", "other-tasks", "gpipe", "byteps", "today", "schedules", "validation")
_CpuProfiles = Annotated[str | None, typer.Option(
    help="folder of the S2VT, AWD-LM, GPT and ResNet-50 profiles measured on this CPU: read "
         "from here, or measured and saved here (default: the repository's results/profiles)")]
_ValidationSystems = Annotated[str, typer.Option(
    "--systems", help="validation: simulated systems",
    show_default=f"every system of our runtime that needs no schedule file, plus "
                 f"{systems.PAPER['data-parallel']}")]
_ValidationWorkloads = Annotated[str, typer.Option(
    help="validation: workloads (tiny scale; GPT as gpt-llama: no tied-gradient messages)")]
_ValidationRepeats = Annotated[int, typer.Option(
    help="validation: runs of every row, in rounds; a row is its median repeat")]
_GpuProfiles = Annotated[str | None, typer.Option(
    help="schedules: full-scale GPU profiles for the current cluster (default "
         "results/profiles/h100)")]


@app.command()
def reproduce(
    table: Annotated[str, typer.Argument(help="table1, other-tasks, gpipe, byteps, today, "
                                         "schedules or validation")],
    profiles: Annotated[str | None, typer.Option(
        help="folder of PipeDream graph.txt profiles, e.g. ../shared/pipedream-profiles")]
    = None,
    cpu_profiles: _CpuProfiles = None,
    minibatches: Annotated[int | None, typer.Option(
        help="minibatches per simulation (default 256; schedules: 32)")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="markdown file")] = None,
    workloads: _ValidationWorkloads = "vgg16,gnmt8,gpt-llama",
    workers: Annotated[str, typer.Option(help="validation: worker counts")] = "1,2,4",
    system_names: _ValidationSystems = ",".join(systems.VALIDATED),
    steps: Annotated[int, typer.Option(help="validation: minibatches per epoch")] = 24,
    epochs: Annotated[int, typer.Option(help="validation: epochs per run")] = 3,
    repeats: _ValidationRepeats = 3,
    quiet: Quiet = False,
    json_path: Annotated[str | None, typer.Option(
        "--json", help="also write the rows as JSON")] = None,
    gpu_profiles: _GpuProfiles = None,
) -> None:
    """Reproduce a table: the PipeDream paper's beside our simulations, or the simulator
    against runs on this machine.

    - table1, other-tasks, gpipe: the PipeDream paper's tables beside our plans and
      simulations.
    - byteps: data parallelism under all-reduce, parameter servers and BytePS.
    - today: the planner on full-scale GPU profiles and a current cluster (--profiles
      default results/profiles/h100).
    - schedules: every pipeline schedule side by side on the paper's clusters and a current
      one (--profiles: the paper's, --gpu-profiles: ours).
    - validation: the simulator against runs on this machine."""
    from harness.paths import RESULTS
    from harness.reporting.progress import Progress

    if table not in _TABLES:
        raise UserInputError(f"unknown table {table!r}; choose table1, other-tasks, gpipe, "
                             "byteps, today, schedules or validation")
    if minibatches is None:
        minibatches = 32 if table == "schedules" else 256
    require_int("--minibatches", minibatches)
    require_output(output)
    require_output(json_path, "--json")
    progress = Progress(enabled=not quiet)
    cpu_profiles = cpu_profiles or str(RESULTS / "profiles")
    h100 = str(RESULTS / "profiles" / "h100")  # full-scale GPU profiles measured here
    if table == "validation":
        text = _validation(workloads, workers, system_names, steps, epochs, repeats, progress)
    elif table in ("table1", "other-tasks", "gpipe"):
        text = _paper_table(table, profiles, cpu_profiles, minibatches, progress, output,
                            json_path)
    elif table == "byteps":
        text = _byteps(profiles, cpu_profiles, minibatches, progress, json_path)
    elif table == "schedules":
        text = _schedules(profiles, cpu_profiles, gpu_profiles or h100, minibatches, progress,
                          output, json_path)
    else:  # today: measured full-scale GPU profiles on a current cluster
        text = _today(profiles or h100, minibatches, progress, json_path)
    emit(text, output, quiet)


def _validation(workloads: str, workers: str, system_names: str, steps: int, epochs: int,
                repeats: int, progress) -> str:  # noqa: ANN001
    """``reproduce validation``: the simulator against runs on this machine."""
    counts = parse_ints("--workers", workers)  # before importing torch
    from harness.sim.validation import validate
    from harness.sim.validation_report import markdown

    names = tuple(w.strip() for w in workloads.split(",") if w.strip())
    rows, machine = validate(names, counts,
                             tuple(s.strip() for s in system_names.split(",") if s.strip()),
                             steps, epochs, "pipebench-validation", progress, repeats)
    return markdown(rows, machine, command_line())


def _paper_table(table: str, profiles: str | None, cpu_profiles: str, minibatches: int,
                 progress, output: str | None, json_path: str | None) -> str:  # noqa: ANN001
    """``reproduce table1``, ``other-tasks`` or ``gpipe``: the paper's table beside ours,
    with a plot of both next to ``output``."""
    from pathlib import Path

    from harness.sim import paper
    from harness.sim import reproduce as rp
    from harness.sim import reproduce_text as rt
    from harness.sim.calibration import fit_on

    command = command_line()
    source = rp.ProfileSource(profiles, progress, cpu_profiles)
    fitted = fit_on(source, progress)
    if table == "gpipe":
        rows = rp.gpipe_rows(source, minibatches, fitted, progress)
        text = rt.gpipe_markdown(rows, fitted, command)
    else:
        rows = rp.table_rows(paper.TABLE1 if table == "table1" else paper.OTHER_TASKS,
                             source, minibatches, fitted, progress)
        title = ("Table 1: speedup and communication vs data parallelism"
                 if table == "table1" else
                 "Epoch time: PipeDream vs data parallelism on other tasks")
        text = rt.table_markdown(title, rows, fitted, command)
    if json_path:
        rt.write_json(rows, fitted, json_path)
    if output:
        png = str(Path(output).with_suffix(".png"))
        series, ylabel = rt.GPIPE_PLOT if table == "gpipe" else rt.SPEEDUP_PLOT
        rt.plot(rows, series, ylabel, png, f"{table}: paper vs simulated")
        text += f"\n![paper vs simulated]({Path(png).name})\n"
    return text


def _byteps(profiles: str | None, cpu_profiles: str, minibatches: int, progress,
            json_path: str | None) -> str:  # noqa: ANN001
    """``reproduce byteps``: data parallelism under all-reduce, parameter servers, BytePS."""
    from harness.sim import byteps
    from harness.sim.profile_source import ProfileSource

    rows = byteps.byteps_rows(ProfileSource(profiles, progress, cpu_profiles), minibatches,
                              progress)
    text = byteps.byteps_markdown(rows, command_line())
    if json_path:
        byteps.write_json(rows, json_path)
    return text


def _schedules(profiles: str | None, cpu_profiles: str, gpu_profiles: str, minibatches: int,
               progress, output: str | None, json_path: str | None) -> str:  # noqa: ANN001
    """``reproduce schedules``: every pipeline schedule side by side, with a plot next to
    ``output``."""
    from pathlib import Path

    from harness.sim import schedule_table as st
    from harness.sim import schedule_text

    rows = st.rows(profiles, cpu_profiles, gpu_profiles, minibatches, progress)
    png = str(Path(output).with_suffix(".png")) if output else None
    if png:
        st.plot(rows, png)
    text = schedule_text.markdown(rows, command_line(), Path(png).name if png else None)
    if json_path:
        st.write_json(rows, json_path)
    return text


def _today(folder: str, minibatches: int, progress, json_path: str | None) -> str:  # noqa: ANN001
    """``reproduce today``: the planner on full-scale GPU profiles and a current cluster."""
    from harness.sim import today

    rows = today.rows(folder, minibatches, progress)
    text = today.markdown(rows, folder, command_line())
    if json_path:
        today.write_json(rows, json_path)
    return text
