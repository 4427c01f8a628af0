"""Simulated versus measured throughput on this machine: ``pipebench reproduce validation``.

For each workload, worker count and system that runs here: profile the workload here, plan
the straight split every pipeline shares, measure what each action of that system costs on
the runtime's own code path, run the system for a few epochs of a fixed number of
minibatches (``pipebench run`` underneath: real processes, real MLflow runs), simulate
exactly those minibatches per epoch with the same split, and compare throughputs.

The machine model the simulator gets (``MachineModel``), all measured here, none of it read
off the runs it is compared with:

- action costs: every rank of the system's schedule executed in one process by the
  runtime's own handlers (``pipedream_impl.runtime.local``: real data, real stage modules, weight
  stashing, optimizer, batch building, loss), two epochs, the second one's mean seconds per
  forward, backward and update of each stage; DDP: the whole model at its per-worker slice
  of the global minibatch on the same handlers (DDP's own bucketing is not timed).
  Measured just before the run it predicts (the machine drifts);
- transfers: each stage's typical message each way (the tensors' shapes and dtypes, read
  off the in-process run) sent through the runtime's ``Comm`` in a ping-pong between two
  processes: its one-way time, with the cores kept busy by as many computing processes as
  there are cores unless the system computes on one rank at a time (model parallelism):
  gloo's threads then wait for the scheduler, as in a run where every worker computes.
  gloo moves a message only once its receive is posted (``MachineModel.rendezvous``);
  the sender's own time in the send call is charged to the sender (``send_s``);
  the plain ping-pong's latency and bandwidth are reported beside;
- the gloo all-reduce among W processes, fitted as fixed + per-byte time at two sizes,
  with the cores kept busy (DDP reduces while every worker computes);
- cores: with no spare core DDP (and our pipeline's replicated stages) cannot overlap the
  all-reduce with the backward; with more workers than cores a run takes at least all
  ranks' busy time divided by the cores (``MachineModel.cores``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from core.errors import UserInputError, require_int
from core.markdown import markdown_table
from harness import metrics, systems
from harness.config import RunConfig
from harness.reporting.progress import Progress
from harness.sim.costs import MachineModel
from harness.sim.microbench import measure_allreduce, measure_link, measure_transfers
from harness.sim.simulator import (
    SimLayout,
    SimOptions,
    plan_groups,
    simulate_system,
)
from harness.sim.validation_compute import (
    comm_counts,
    comm_in_run,
    compute_in_run,
    kinds_in_run,
    ratios_cell,
    scale_compute,
)
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.planner.plan import plan_profile
from pipedream_impl.profiling.profile import Profile
from pipedream_impl.profiling.profiler import profile_workload
from pipedream_impl.schedule import registry as schedules
from pipedream_impl.schedule.actions import BACKWARDS
from workloads import registry
from workloads.recipe import load_splits

__all__ = ["ValidationRow", "markdown", "measured_actions", "validate"]


@dataclass
class ValidationRow:
    workload: str
    system: str  # simulator name
    workers: int
    config: str
    measured: float
    simulated: float
    actions: str = ""  # the measured action costs the simulation used
    # idle share of the workers' time (mean over workers): the runs' bubble_fraction
    # metrics (blocked receives and all-reduce waits); simulated: the time no F, B, U or A
    # runs. None for systems that do not report idle time
    measured_bubble: float | None = None
    simulated_bubble: float | None = None
    # each stage's compute per minibatch in the run over the same measured alone (the
    # run's ``metrics.STAGE_MEASURED`` against the one-process action costs), the same
    # ratio per compute kind (``kinds_in_run``, where the run timed each worker's kinds),
    # and the simulation again with each kind's cost scaled by its own ratio (else by its
    # stage's): the part of the error that the schedule and communication model leave
    # once the run's own compute is known
    compute_in_run: tuple[float, ...] = ()
    resimulated: float | None = None
    kinds_in_run: tuple[dict[str, float], ...] = ()
    # the simulation again with each transfer's one-way time measured on idle cores (the
    # loaded microbenchmark's median falls on a scheduler slice or not from one
    # measurement to the next); None where the transfers were measured unloaded anyway
    unloaded: float | None = None
    # the simulation with the run's compute (``resimulated``) and the run's own time per
    # send and per receive (``comm_in_run``): what remains once both are known
    with_comm: float | None = None

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1.0


def measured_actions(name: str, replicas: tuple[int, ...], bounds: tuple[tuple[int, int], ...],
                     batch: int, steps: int, schedule: str = schedules.DEFAULT,
                     in_flight: int | None = None,
                     microbatches: int = 1) \
        -> tuple[dict[int, dict[str, float]], dict[tuple[int, str], list[tuple]]]:
    """Seconds per action kind of each stage, on the runtime's code path in this process
    (``pipedream_impl.runtime.local``; the first epoch warms up, the second is measured), and the
    typical message each stage sends each way."""
    from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
    from pipedream_impl.runtime.local import (
        action_costs,
        local_executors,
        run_local,
        typical_messages,
    )

    spec = WorkerSpec(0, RunSettings(name, "tiny", 0, batch, max_steps=steps, timeout_s=60.0),
                      SystemSettings(replicas, bounds, schedule=schedule, in_flight=in_flight,
                                     microbatches=microbatches))
    executors = local_executors(spec)
    run_local(executors, 0)
    return action_costs(run_local(executors, 1), executors), typical_messages(executors)


@dataclass
class _Setup:
    """What one workload's rows share."""
    name: str
    batch: int
    steps: int  # minibatches per epoch
    epochs: int
    experiment: str
    cores: int
    latency: float
    bandwidth: float
    allreduce: dict[int, tuple[float, float]]  # workers -> measured fit
    tmp: Path


def validate(workloads: tuple[str, ...], worker_counts: tuple[int, ...],
             system_names: tuple[str, ...], steps: int, epochs: int, experiment: str,
             progress: Progress) -> tuple[list[ValidationRow], dict[str, float]]:
    _check_inputs(workloads, worker_counts, system_names, steps, epochs)
    torch.set_num_threads(1)
    latency, bandwidth = measure_link()
    cores = os.cpu_count() or 1
    machine = {"latency_s": latency, "bandwidth_Bps": bandwidth, "cores": cores}
    progress.note(f"gloo link here: latency {latency * 1e6:.0f} us, "
                  f"{bandwidth / 1e9:.2f} GB/s")
    # DDP's all-reduce runs while every core computes: measured with the cores kept busy
    allreduce = {w: measure_allreduce(w, load=cores) for w in worker_counts
                 if w > 1 and any(systems.simulated(s).kind == "data-parallel"
                                  for s in system_names)}
    for w, (fixed, per_byte) in allreduce.items():
        machine[f"allreduce_fixed_s.{w}"] = fixed
        machine[f"allreduce_s_per_byte.{w}"] = per_byte
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipebench-validate-") as tmp:
        for name in workloads:
            wl = registry.get(name)
            b = wl.spec("tiny").batch_size
            n_train = len(load_splits(wl, "tiny", None, 0).train)
            setup = _Setup(name, b, min(steps, n_train // b), epochs, experiment, cores,
                           latency, bandwidth, allreduce, Path(tmp))
            prof = profile_workload(wl, "tiny", b, torch.device("cpu"), steps=5)
            for w in worker_counts:
                for system in system_names:
                    if w == 1 and systems.simulated(system).sim != "in-flight-1":
                        continue  # one worker: the single-process run, simulated once
                    rows.append(_one(setup, prof, system, w, progress))
    return rows, machine


def _check_inputs(workloads: tuple[str, ...], worker_counts: tuple[int, ...],
                  system_names: tuple[str, ...], steps: int, epochs: int) -> None:
    """Every name, count and run of the validation, checked before anything is measured
    (each run's RunConfig as ``_one`` will build it, less the plan file made on the way)."""
    from harness.experiments.layout import check_run

    require_int("--steps", steps)
    require_int("--epochs", epochs)
    if not workloads or not system_names or not worker_counts:
        raise UserInputError("give at least one workload, system and worker count (e.g. "
                             "--workloads vgg16 --systems pipedream --workers 1,2)")
    one_process = next(s for s in systems.SYSTEMS if not s.multi_process)
    for name in workloads:
        registry.get(name)
        for system in system_names:
            sys_ = systems.simulated(system)
            for w in worker_counts:
                require_int("--workers", w)
                check_run(RunConfig.from_flags(
                    system=sys_.name if w > 1 else one_process.name, workload=name,
                    scale="tiny", epochs=epochs, threads=1, workers=w,
                    max_steps_per_epoch=steps))


def _one(setup: _Setup, prof: Profile, system: str, w: int, progress: Progress) \
        -> ValidationRow:
    from harness.experiments.runner import run

    name, b, k = setup.name, setup.batch, setup.steps
    sys_ = systems.simulated(system)
    kind = sys_.sim
    wl = registry.get(name)
    cluster = Cluster((Level(w, setup.bandwidth),))
    straight = plan_profile(prof, cluster, straight=True)
    bounds = tuple(tuple(s.layers) for s in straight.stages)
    plan_path = setup.tmp / f"{name}-{w}.json"
    plan_path.write_text(straight.to_json())
    m = schedules.microbatches(sys_.schedule, w) if sys_.microbatched else 1
    spare = setup.cores > w  # a core left over for communication
    idle: dict = {}  # one-way times on idle cores, where the model takes loaded ones
    if kind == "data-parallel":  # global minibatch b: each replica trains b / w of it
        groups, replicas, placement = [tuple(prof.graph().nodes)], (w,), None
        actions, _ = measured_actions(name, (1,), ((0, bounds[-1][1]),), b // w, k * w)
        transfers = {}
    else:
        groups, replicas, placement = plan_groups(straight)
        actions, messages = measured_actions(name, replicas, bounds, b, k,
                                             sys_.schedule, sys_.in_flight, m)
        # model parallelism computes on one rank at a time; the others keep every core busy
        # (the sender's own time in a send is taken unloaded: its CPU work, not the wait)
        transfers = measure_transfers(messages, wl.static_shapes)
        if kind != "in-flight-1":
            idle = {key: t[0] for key, t in transfers.items()}
            loaded = measure_transfers(messages, wl.static_shapes, load=setup.cores)
            transfers = {key: (loaded[key][0], t[1]) for key, t in transfers.items()}
    model = MachineModel(action_s=actions,
                         transfer_s={key: t[0] for key, t in transfers.items()} or None,
                         send_s={key: t[1] for key, t in transfers.items()} or None,
                         header_messages=0 if wl.static_shapes else 1,
                         rendezvous=not wl.static_shapes,  # else posted ahead (Comm.recv)
                         allreduce_fit=setup.allreduce.get(w) if kind == "data-parallel" else None,
                         cores=setup.cores)
    one_process = next(s for s in systems.SYSTEMS if not s.multi_process)
    cfg = RunConfig.from_flags(
        system=sys_.name if w > 1 else one_process.name, workload=name, scale="tiny",
        epochs=setup.epochs, target=1e9 if wl.higher_is_better else -1e9, threads=1,
        workers=w, max_steps_per_epoch=k, experiment=setup.experiment,
        plan=str(plan_path) if (w > 1 and kind != "data-parallel") else None,
        microbatches=m if sys_.microbatched else None)
    progress.note(f"validation: {name} {cfg.system} on {w} worker(s)")
    summary = run(cfg, progress)
    options = SimOptions(minibatches=k * w if kind == "data-parallel" else k,
                         microbatches=m, latency_s=setup.latency, dp_overlap=spare,
                         pipeline_overlap=spare, machine=model)
    layout = SimLayout(groups, replicas, placement)
    sim = simulate_system(prof, cluster, system, layout, options)
    # the runtime drains its pipeline at every epoch end: an epoch is k minibatches
    simulated = k * b / sim.total_s

    def again(**fields) -> float:  # noqa: ANN003 - MachineModel fields to replace
        """Samples/s of the simulation again with those fields of the machine model."""
        machine = replace(model, **fields)
        return k * b / simulate_system(prof, cluster, system, layout,
                                       replace(options, machine=machine)).total_s

    unloaded = again(transfer_s=idle) if idle else None
    costs = " / ".join(" ".join([f"{kind} {1e3 * actions[st][kind]:.2f}"
                                 for kind in ("F", *BACKWARDS, "U") if kind in actions[st]]
                                + [f"S{kind} {1e3 * transfers[(st, kind)][0]:.2f}"
                                   + (f" / {1e3 * idle[(st, kind)]:.2f}" if idle else "")
                                   + f" ({1e3 * transfers[(st, kind)][1]:.2f})"
                                   for kind in ("F", "B") if (st, kind) in transfers])
                       for st in sorted(actions))
    bubble = metrics.mean_bubble(summary.final_metrics)
    sim_bubble = statistics.mean(
        1 - sum(e - s for s, e, a in row if a.kind in ("F", *BACKWARDS, "U", "A")) / sim.total_s
        for row in sim.timeline)
    ratios = compute_in_run(actions, summary.final_metrics, m)
    per_kind = kinds_in_run(actions, summary.final_metrics, m, replicas)
    resimulated = with_comm = None
    if ratios:  # (with more workers than cores, the run's times hold the wait for a core)
        scaled = scale_compute(actions, ratios, per_kind)
        resimulated = again(action_s=scaled)
        done = sum(e.steps for e in summary.epochs) / k  # epochs' worth of minibatches
        sends, recvs = comm_in_run(summary.final_metrics, comm_counts(sys_, replicas, k, m),
                                   done)
        if sends and all(r == 1 for r in replicas) and w <= setup.cores:
            with_comm = again(action_s=scaled, send_s=sends, recv_s=recvs)
    return ValidationRow(name, cfg.system, w, "-".join(map(str, replicas)),
                         summary.throughput, simulated, costs,
                         bubble, None if bubble is None else sim_bubble,
                         tuple(ratios[st] for st in sorted(ratios)), resimulated,
                         tuple(per_kind[st] for st in sorted(per_kind)), unloaded, with_comm)


def markdown(rows: list[ValidationRow], machine: dict[str, float], command: str) -> str:
    from harness.experiments.runner import runtime_env

    switches = runtime_env()  # named where a run's switches are not the defaults
    ran = "" if switches == "defaults" else f" with the runtime switches {switches}"
    lines = ["# Simulator validation: simulated vs measured throughput on this machine", "",
             f"Generated by `{command}`{ran}. Measured: real runs here (CPU, gloo, 1 thread per "
             "worker, tiny scale, median epoch throughput with warm-up excluded). Simulated: "
             "`harness/sim/simulator.py` on the same straight split and the same minibatches per "
             "epoch, with the machine model below (see `harness/sim/validation.py`): each "
             "action's cost measured on the runtime's own code path in one process just "
             "before the run, transfers and all-reduces from gloo microbenchmarks.", "",
             f"Machine model (measured here): gloo latency {machine['latency_s'] * 1e6:.0f} us,"
             f" bandwidth {machine['bandwidth_Bps'] / 1e9:.2f} GB/s, {machine['cores']:.0f} "
             "cores (with no spare core DDP does not overlap; with more workers than cores, a "
             "run takes at least all ranks' busy time over the cores). Transfers (S F/B "
             "below): one-way time of each stage's typical message through the runtime's "
             "Comm (a median of round trips), measured with the cores busy except for model "
             "parallelism, then after a slash on idle cores, and in parentheses the sender's "
             "own time in the send call; a message moves once its receive is posted (gloo). "
             "Simulated with idle-core transfers: the simulation again with the idle cores' "
             "one-way times (on busy cores a median falls on a scheduler slice, about 2 ms "
             "here, or not, from one measurement to the next; a receiver that waits leaves "
             "its core idle)."]
    for k, v in machine.items():
        if k.startswith("allreduce_fixed_s."):
            w = k.split(".", 1)[1]
            lines.append(f"gloo all-reduce among {w}: {v * 1e3:.2f} ms + "
                         f"{machine[f'allreduce_s_per_byte.{w}'] * 1e9:.2f} ns per byte.")
    lines += ["", "Compute in the run / alone: each stage's compute per minibatch in the run "
              "(its workers' timed F, B and U) over the same from the action costs measured "
              "alone, in one process (the warm-up epoch counts in the run's figure, not in "
              "the other), and in parentheses the same ratio for each kind of action (its "
              "share of the seconds the worker timed). Simulated with the run's compute: the "
              "simulation again with each compute action's cost scaled by its kind's ratio "
              "(by its stage's where the run timed no kinds), its error beside: what remains "
              "for the schedule and communication model once the run's own compute is "
              "known. ... and its sends and receives: the same, with each send's time and "
              "each receive's CPU time in the run (per unit, from the run's action times "
              "over the schedule's count; a receive's wall time holds its wait) charged to "
              "the sender and the receiver. A diagnosis, not a prediction: the goal is "
              "judged on the first error. "
              "'-' where the run times no compute per stage (data parallelism)."]
    lines += [""] + markdown_table(
        ("workload", "system", "workers", "config", "measured samples/s",
         "simulated samples/s", "error", "compute in the run / alone",
         "simulated with the run's compute", "... and its sends and receives",
         "simulated with idle-core transfers",
         "bubble measured / simulated",
         "action costs per stage (ms per unit)"),
        [(r.workload, r.system, r.workers, r.config, f"{r.measured:.0f}",
          f"{r.simulated:.0f}", f"{100 * r.error:+.0f}%",
          ratios_cell(r.compute_in_run, r.kinds_in_run),
          *(_with_error(getattr(r, f), r.measured) for f in _DIAGNOSES),
          "-" if r.measured_bubble is None else
          f"{r.measured_bubble:.0%} / {r.simulated_bubble:.0%}", r.actions) for r in rows])
    with_bubble = [r for r in rows if r.measured_bubble is not None]
    if with_bubble:
        close = sum(abs(r.measured_bubble - r.simulated_bubble) <= 0.05 for r in with_bubble)
        lines.append(f"\nBubble: {close} of {len(with_bubble)} runs within 5 points of the "
                     "simulated bubble.")
    for w in sorted({r.workers for r in rows}):
        errs = [abs(r.error) for r in rows if r.workers == w]
        within = sum(e <= 0.10 for e in errs)
        goal = " (goal: all)" if w == 2 else ""
        lines.append(f"{'' if w > min(r.workers for r in rows) else chr(10)}"
                     f"At {w} worker(s): {within} of {len(errs)} within 10%{goal}; median "
                     f"|error| {100 * statistics.median(errs):.0f}%, worst "
                     f"{100 * max(errs):.0f}%"
                     + "".join(_again(rows, w, f, what) for f, what in _DIAGNOSES.items())
                     + ".")
    return "\n".join(lines) + "\n"


# the diagnostic simulations, in the table's order: the row's field -> its summary's words
_DIAGNOSES = {"resimulated": "with the run's own compute",
              "with_comm": "with its sends and receives too",
              "unloaded": "with idle-core transfers, of the rows that measured them"}


def _with_error(simulated: float | None, measured: float) -> str:
    """A diagnostic simulation's samples/s and its error against the run ('-' if none)."""
    return "-" if simulated is None else \
        f"{simulated:.0f} ({100 * (simulated / measured - 1):+.0f}%)"


def _again(rows: list[ValidationRow], w: int, field: str, what: str) -> str:
    """The summary of one diagnostic simulation's errors at ``w`` workers ('' if none)."""
    errs = [abs(getattr(r, field) / r.measured - 1) for r in rows
            if r.workers == w and getattr(r, field) is not None]
    if not errs:
        return ""
    return (f"; {what} {sum(e <= 0.10 for e in errs)} of {len(errs)} within 10%, median "
            f"|error| {100 * statistics.median(errs):.0f}%")
