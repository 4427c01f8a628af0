"""Simulated versus measured throughput on this machine: ``pipebench reproduce validation``.

For each workload, worker count and system that runs here: profile the workload here, plan
the straight split every pipeline shares, measure what each action of that system costs on
the runtime's own code path, run the system for a few epochs of a fixed number of
minibatches (``pipebench run`` underneath: real processes, real MLflow runs), simulate
exactly those minibatches per epoch with the same split, and compare throughputs. Every row
runs ``repeats`` times, in rounds; ``validation_report`` makes one row of its repeats.

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
- data parallelism's all-reduce: its gradient buckets (DDP's, from
  ``baselines.ddp.gradient_buckets``; else one of all the bytes) all-reduced one after
  another among W processes with gloo, at their own sizes, on cores idle but for gloo:
  with no spare core nothing overlaps, and the all-reduce runs after the backward while
  its workers wait for it (the same with the cores kept busy is reported beside);
  measured just before the run;
- cores: with no spare core DDP (and our pipeline's replicated stages) cannot overlap the
  all-reduce with the backward; with more workers than cores the ranks computing at once
  share the cores (``harness.sim.shared_cores``) and a run takes at least all ranks' busy
  time divided by the cores (``MachineModel.cores``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from baselines.ddp import DDPExecutor, gradient_buckets
from core.errors import UserInputError, require_int
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
    cpu_of_kinds,
    kinds_in_run,
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

__all__ = ["ValidationRow", "measured_actions", "validate"]


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
    # the simulation with every action's CPU in the run (``cpu_of_kinds``, ``comm_in_run``
    # with ``cpu``) on the machine's cores, shared where the workers outnumber them: what
    # remains once the run's CPU per action is known and its wait for a core is modelled
    with_cpu: float | None = None
    # (measured, simulated) samples/s of every repeat of the row, in the order they ran;
    # the row's other figures are its median repeat's (``validation_report.merge``)
    repeats: tuple[tuple[float, float], ...] = ()

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
    tmp: Path
    meta: dict  # the training split's, to build the model


def validate(workloads: tuple[str, ...], worker_counts: tuple[int, ...],
             system_names: tuple[str, ...], steps: int, epochs: int, experiment: str,
             progress: Progress, repeats: int = 1) \
        -> tuple[list[ValidationRow], dict[str, float]]:
    """Every row once per repeat, in rounds (each round runs every row once, so that the
    machine's drift falls on every row alike), each a run and its simulation back to back;
    ``validation_report.merge`` makes one row of a row's repeats."""
    _check_inputs(workloads, worker_counts, system_names, steps, epochs, repeats)
    torch.set_num_threads(1)
    latency, bandwidth = measure_link()
    cores = os.cpu_count() or 1
    machine = {"latency_s": latency, "bandwidth_Bps": bandwidth, "cores": cores,
               "repeats": repeats}
    progress.note(f"gloo link here: latency {latency * 1e6:.0f} us, "
                  f"{bandwidth / 1e9:.2f} GB/s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipebench-validate-") as tmp:
        cells = []  # (setup, profile, system, workers): one per row, profiled once
        for name in workloads:
            wl = registry.get(name)
            b = wl.spec("tiny").batch_size
            train = load_splits(wl, "tiny", None, 0).train
            setup = _Setup(name, b, min(steps, len(train) // b), epochs, experiment, cores,
                           latency, bandwidth, Path(tmp), train.meta)
            prof = profile_workload(wl, "tiny", b, torch.device("cpu"), steps=5)
            cells += [(setup, prof, system, w) for w in worker_counts for system in system_names
                      # one worker: the single-process run, simulated once
                      if w > 1 or systems.simulated(system).sim == "in-flight-1"]
        for r in range(repeats):
            for i, (setup, prof, system, w) in enumerate(cells):
                progress.note(f"validation: repeat {r + 1} of {repeats}, row {i + 1} of "
                              f"{len(cells)}")
                rows.append(_one(setup, prof, system, w, progress))
    return rows, machine


def _check_inputs(workloads: tuple[str, ...], worker_counts: tuple[int, ...],
                  system_names: tuple[str, ...], steps: int, epochs: int,
                  repeats: int) -> None:
    """Every name, count and run of the validation, checked before anything is measured
    (each run's RunConfig as ``_one`` will build it, less the plan file made on the way)."""
    from harness.experiments.layout import check_run

    require_int("--steps", steps)
    require_int("--epochs", epochs)
    require_int("--repeats", repeats)
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
    allreduce = allreduce_cpu = None  # data parallelism: its all-reduce's seconds per
    # update, measured: elapsed and one rank's CPU time
    ar_cell = ""  # ... and both figures for the row's action costs
    if kind == "data-parallel":  # global minibatch b: each replica trains b / w of it
        groups, replicas, placement = [tuple(prof.graph().nodes)], (w,), None
        actions, _ = measured_actions(name, (1,), ((0, bounds[-1][1]),), b // w, k * w)
        transfers = {}
        params = list(wl.build("tiny", setup.meta).parameters())
        buckets = gradient_buckets(params) if sys_.executor == \
            f"{DDPExecutor.__module__}:{DDPExecutor.__qualname__}" else \
            (sum(p.numel() * p.element_size() for p in params),)
        # with no spare core nothing overlaps: the all-reduce runs after the backward,
        # its workers waiting for it (cores idle but for gloo); beside it, for the page,
        # the same with every core kept busy
        elapsed, cpu = measure_allreduce(w, buckets)
        allreduce, allreduce_cpu = {0: elapsed}, {0: cpu}
        busy, _ = measure_allreduce(w, buckets, load=setup.cores)
        ar_cell = (f" AR {1e3 * elapsed:.2f} / {1e3 * busy:.2f} (CPU {1e3 * cpu:.2f}; "
                   f"{len(buckets)} buckets)")
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
                         allreduce_s=allreduce, allreduce_cpu_s=allreduce_cpu,
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
                       for st in sorted(actions)) + ar_cell
    bubble = metrics.mean_bubble(summary.final_metrics)
    sim_bubble = statistics.mean(
        1 - sum(e - s for s, e, a in row if a.kind in ("F", *BACKWARDS, "U", "A")) / sim.total_s
        for row in sim.timeline)
    ratios = compute_in_run(actions, summary.final_metrics, m)
    per_kind = kinds_in_run(actions, summary.final_metrics, m, replicas)
    resimulated = with_comm = with_cpu = None
    if ratios:  # with more workers than cores the run's times hold their wait for a core:
        # simulated without sharing cores again (``harness.sim.shared_cores``)
        scaled = scale_compute(actions, ratios, per_kind)
        resimulated = again(action_s=scaled, cores=None)
        done = sum(e.steps for e in summary.epochs) / k  # epochs' worth of minibatches
        counts = comm_counts(sys_, replicas, k, m)
        sends, recvs = comm_in_run(summary.final_metrics, counts, done)
        if sends and all(r == 1 for r in replicas):  # the run's sends hold their wait
            # for a core too: on cores unshared, as above
            with_comm = again(action_s=scaled, send_s=sends, recv_s=recvs, cores=None)
            cpu = cpu_of_kinds(per_kind, summary.final_metrics)
            sends_cpu, _ = comm_in_run(summary.final_metrics, counts, done, cpu=True)
            if cpu and sends_cpu:
                with_cpu = again(action_s=scale_compute(actions, ratios, cpu),
                                 send_s=sends_cpu, recv_s=recvs)
    return ValidationRow(name, cfg.system, w, "-".join(map(str, replicas)),
                         summary.throughput, simulated, costs,
                         bubble, None if bubble is None else sim_bubble,
                         tuple(ratios[st] for st in sorted(ratios)), resimulated,
                         tuple(per_kind[st] for st in sorted(per_kind)), unloaded, with_comm,
                         with_cpu)
