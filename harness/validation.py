"""Simulated versus measured throughput on this machine: ``pipebench reproduce validation``.

For each workload, worker count and system that runs here: profile the workload here (one
thread, as every worker gets), plan the straight split every pipeline shares, run the
system for a few epochs of a fixed number of minibatches (``pipebench run`` underneath:
real processes, real MLflow runs), simulate exactly those minibatches per epoch with the
same split, and compare throughputs.

The machine model the simulator gets, all measured here first: the gloo link (latency and
bandwidth from a ping-pong between two processes), the optimizer step time per parameter
byte (the profiles leave it out), and time-sharing: with more workers than cores, each
worker computes at cores / workers of its speed (``compute_factor``). Profiles are scaled
so their layers add up to a measured whole step (timing layers one by one adds overhead).
GPipe is profiled at its microbatch size (no linear scaling); everything else at the
minibatch size; DDP at its per-worker slice of the global minibatch. DDP's all-reduce
overlaps the backward only when a core is spare; our runtime's shape header is one more
message per send unless shapes are static; building a batch (measured) is paid by stage
0's forward and by the last stage's (which builds it again to read the targets).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.config import RunConfig
from harness.progress import Progress
from harness.simulator import plan_groups, simulate_system
from pipedream_impl.cluster import Cluster, Level
from pipedream_impl.plan import Plan, plan_profile
from pipedream_impl.profile import Profile
from pipedream_impl.profiler import profile_workload, whole_step_ms
from workloads import registry
from workloads.recipe import load_splits, make_optimizer

RUN_SYSTEM = {"pipedream": "pipedream", "gpipe": "gpipe", "mp": "model-parallel", "dp": "ddp"}


@dataclass
class ValidationRow:
    workload: str
    system: str  # simulator name
    workers: int
    config: str
    measured: float
    simulated: float

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1.0


def _pingpong(rank: int, port: int, sizes: list[int], reps: int, out) -> None:  # noqa: ANN001
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    times = {}
    for n in sizes:
        t = torch.zeros(max(1, n // 4))
        for rep in range(reps + 2):
            if rep == 2:
                t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
        times[n] = (time.perf_counter() - t0) / (2 * reps)  # one way
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def measure_link(reps: int = 50) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of gloo between two local processes."""
    import torch.multiprocessing as mp

    from harness.pipeline_system import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    sizes = [4, 4 << 20]
    port = free_port()
    procs = [ctx.Process(target=_pingpong, args=(r, port, sizes, reps, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    times = out.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    latency = times[sizes[0]]
    return latency, sizes[1] / max(1e-9, times[sizes[1]] - latency)


def calibrated_profile(name: str, batch: int) -> tuple[Profile, float]:
    """Per-layer profile here, scaled so its layers add up to a measured whole step
    (timing layers one by one adds per-layer overhead the real step does not pay).
    Returns (profile, the scale applied)."""
    wl = registry.get(name)
    prof = profile_workload(wl, "tiny", batch, torch.device("cpu"), steps=5)
    splits = wl.default_data("tiny", 0)
    model = wl.build("tiny", {**splits.train.meta, "init_seed": 0})
    b = wl.make_batch(splits.train, torch.arange(min(batch, len(splits.train))))
    whole = whole_step_ms(model, b, wl.loss, torch.device("cpu"), warmup=3, steps=10)
    scale = whole / sum(n.forward_ms + n.backward_ms for n in prof.layers)
    layers = tuple(dataclasses.replace(n, forward_ms=n.forward_ms * scale,
                                       backward_ms=n.backward_ms * scale)
                   for n in prof.layers)
    return dataclasses.replace(prof, layers=layers), scale


def batch_seconds(name: str, batch: int) -> float:
    """Median time to build one batch of ``batch`` samples (``make_batch``), here."""
    wl = registry.get(name)
    data = wl.default_data("tiny", 0).train
    times = []
    for i in range(12):
        idx = torch.arange(i * batch, (i + 1) * batch) % len(data)
        t0 = time.perf_counter()
        wl.make_batch(data, idx)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def update_seconds_per_byte(workload: str, scale: str, batch: int) -> float:
    """One optimizer step of the whole model, per parameter byte (median of 10)."""
    wl = registry.get(workload)
    splits = wl.default_data(scale, 0)
    model = wl.build(scale, {**splits.train.meta, "init_seed": 0})
    opt = make_optimizer(wl.spec(scale), model.parameters())
    b = wl.make_batch(splits.train, torch.arange(min(batch, len(splits.train))))
    wl.loss(model(b.inputs), b.targets).backward()
    times = []
    for _ in range(12):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return statistics.median(times[2:]) / nbytes


def validate(workloads: tuple[str, ...], worker_counts: tuple[int, ...],
             systems: tuple[str, ...], steps: int, epochs: int, experiment: str,
             progress: Progress) -> tuple[list[ValidationRow], dict[str, float]]:
    from harness.runner import run

    torch.set_num_threads(1)
    latency, bandwidth = measure_link()
    cores = os.cpu_count() or 1
    machine = {"latency_s": latency, "bandwidth_Bps": bandwidth, "cores": cores}
    progress.note(f"gloo link here: latency {latency * 1e6:.0f} us, "
                  f"{bandwidth / 1e9:.2f} GB/s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipebench-validate-") as tmp:
        for name in workloads:
            wl = registry.get(name)
            spec = wl.spec("tiny")
            b = spec.batch_size
            n_train = len(load_splits(wl, "tiny", None, 0).train)
            upd = update_seconds_per_byte(name, "tiny", b)
            machine[f"update_s_per_byte.{name}"] = upd
            prof, scale = calibrated_profile(name, b)
            machine[f"profile_scale.{name}"] = scale
            for w in worker_counts:
                cluster = Cluster((Level(w, bandwidth),))
                factor = min(1.0, cores / w)
                straight = plan_profile(prof, cluster, straight=True)
                plan_path = Path(tmp) / f"{name}-{w}.json"
                plan_path.write_text(straight.to_json())
                for system in systems:
                    if w == 1 and system != "mp":
                        continue
                    rows.append(_one(name, system, w, b, n_train, steps, epochs, prof,
                                     straight, str(plan_path), cluster, factor, latency,
                                     upd, experiment, progress, run))
    return rows, machine


def _one(name, system, w, b, n_train, steps, epochs, prof, straight: Plan,  # noqa: ANN001
         plan_path, cluster, factor, latency, upd, experiment, progress, run):  # noqa: ANN001
    wl = registry.get(name)
    m = 4 * w if system == "gpipe" else 1
    k = min(steps, n_train // b)
    unit_prof, unit = prof, False
    unit_batch = b // m
    if system == "gpipe":
        unit_prof, _ = calibrated_profile(name, b // m)
        unit = True
    elif system == "dp":  # global minibatch b: each replica trains b / w of it
        unit_prof, _ = calibrated_profile(name, b // w)
        unit_batch = b // w
    if system == "dp":
        groups, replicas, placement = [tuple(prof.graph().nodes)], (w,), None
    else:
        groups, replicas, placement = plan_groups(straight)
    sim_system = system if w > 1 else "mp"
    cfg = RunConfig(system=RUN_SYSTEM[system] if w > 1 else "single", workload=name,
                    scale="tiny", epochs=epochs, target=1e9 if wl.higher_is_better else -1e9,
                    threads=1, workers=w, max_steps_per_epoch=k, experiment=experiment,
                    plan=plan_path if (w > 1 and system != "dp") else None,
                    microbatches=m if system == "gpipe" else None)
    label = cfg.system
    progress.note(f"validation: {name} {label} on {w} worker(s)")
    summary = run(cfg, progress)
    sim = simulate_system(unit_prof, cluster, sim_system, groups, replicas, placement,
                          minibatches=k * w if system == "dp" else k, microbatches=m,
                          compute_factor=factor,
                          latency_s=latency, unit_profiled=unit, update_s_per_byte=upd,
                          dp_overlap=(os.cpu_count() or 1) > w,  # a spare core to overlap on
                          header_messages=0 if wl.static_shapes else 1,
                          batch_prep_s=batch_seconds(name, unit_batch))
    # the runtime drains its pipeline at every epoch end: an epoch is k minibatches
    simulated = k * b / sim.total_s
    return ValidationRow(name, label, w, "-".join(map(str, replicas)), summary.throughput,
                         simulated)


def markdown(rows: list[ValidationRow], machine: dict[str, float], command: str) -> str:
    lines = ["# Simulator validation: simulated vs measured throughput on this machine", "",
             f"Generated by `{command}`. Measured: real runs here (CPU, gloo, 1 thread per "
             "worker, tiny scale, median epoch throughput with warm-up excluded). Simulated: "
             "`harness/simulator.py` driven by a profile measured here and the machine "
             "model below, the same straight split and the same minibatches per epoch.", "",
             f"Machine model (measured here): gloo latency {machine['latency_s'] * 1e6:.0f} us,"
             f" bandwidth {machine['bandwidth_Bps'] / 1e9:.2f} GB/s, {machine['cores']:.0f} "
             "cores (workers beyond that share them: compute factor cores / workers)."]
    for k, v in machine.items():
        if k.startswith("profile_scale."):
            lines.append(f"Profile scale, {k.split('.', 1)[1]}: x{v:.2f} (layers timed one by "
                         "one vs a whole step).")
        if k.startswith("update_s_per_byte."):
            lines.append(f"Optimizer step, {k.split('.', 1)[1]}: {v * 1e9:.2f} ns per "
                         "parameter byte.")
    lines += ["", "| workload | system | workers | config | measured samples/s | "
              "simulated samples/s | error |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.workload} | {r.system} | {r.workers} | {r.config} | "
                     f"{r.measured:.0f} | {r.simulated:.0f} | {100 * r.error:+.0f}% |")
    two = [abs(r.error) for r in rows if r.workers == 2]
    if two:
        within = sum(e <= 0.10 for e in two)
        lines += ["", f"At 2 workers: {within} of {len(two)} within 10% (goal: all); "
                  f"median |error| {100 * statistics.median(two):.0f}%, "
                  f"worst {100 * max(two):.0f}%."]
    return "\n".join(lines) + "\n"
