"""``pipebench reproduce schedules``: which pipeline schedule wins where, and by how much.

PipeDream (1F1B with stashing, planned replicated stages) was followed by schedules that
flush (GPipe, PipeDream-Flush), delay updates by one step (PipeDream-2BW), interleave
several stages per worker (Megatron's interleaved 1F1B) or split the backward to fill the
bubble (zero bubble: ZB1P, ZB-V, DualPipeV). This table simulates one system per schedule
(``systems.COMPARED``) for VGG-16, GNMT-16 and ResNet-50 on the paper's clusters (the
authors' V100 profiles) and on a current one (preset H, our H100 profiles), and for our
GPT-2 124M and Llama-style 0.95B workloads (``gpt``, ``gpt-llama``) on the paper's
one-server clusters A:1x4 and B:1x8 (our full-scale profiles measured on a CPU and scaled
to a V100 by one factor, as ``reproduce table1`` does for S2VT and AWD-LM: an estimate, so
compare within a row), and reports per schedule: throughput (and its ratio to the row's
best), the bubble (in steady state, the fraction of a worker's time per minibatch spent
not computing: pipeline bubble and exposed communication, mean over workers), the largest
worker's peak memory (weights + one optimizer slot, stashed versions, activations in
flight) and the weight staleness (the most minibatches by which the weights a gradient is
applied to are newer than those its forward used).

Layouts: PipeDream gets the planner's configuration for the whole cluster; every straight
schedule a pipeline over every worker (the planner's straight split; two stages per
worker for torch's peers); data parallelism every worker. Microbatched schedules use
4 x depth microbatches of the same minibatch (the profile's batch) and scale compute
linearly with the microbatch's share. All-reduces (data parallelism, PipeDream's
replicated stages) on the paper's clusters are the calibrated model ``reproduce table1``
uses (one flat ring at a fitted efficiency per link kind, fitted on the paper's BSP
speedups only), on preset H the ideal ring; both overlapped with the backward.
Everything is simulated; nothing here ran on a cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.errors import UserInputError
from harness import systems
from harness.sim.costs import AllReduceModel
from harness.sim.simulator import SimLayout, SimOptions, SimResult, layout_for, simulate_system
from harness.systems import PAPER
from pipedream_impl.planner.cluster import Cluster, parse_cluster
from pipedream_impl.planner.plan import plan_profile
from pipedream_impl.profiling.profile import Profile, load_profile
from pipedream_impl.runtime.weight_stash import staleness

__all__ = ["LM_CLUSTERS", "LM_WORKLOADS", "PAPER_CLUSTERS", "TODAY_CLUSTERS", "WORKLOADS",
           "cell", "largest_layer", "plot", "repeated_layers", "rows", "stage_shares",
           "staleness_of", "straight_cells", "tie_status", "write_json"]

# (paper's label for the shared V100 profile, our workload name for the H100 profile)
WORKLOADS = (("VGG-16", "vgg16"), ("GNMT-16", "gnmt16"), ("ResNet-50", "resnet50"))
PAPER_CLUSTERS = ("A:1x4", "A:4x4", "B:1x8", "C:4x1")
TODAY_CLUSTERS = ("H:1x8", "H:2x8")
# our GPT workloads (``profile_source.OWN``: no V100 profile exists, so our full-scale CPU
# profiles scaled to a V100, as ``reproduce table1``'s S2VT and AWD-LM rows) on the paper's
# one-server clusters, 4 V100s on PCIe and 8 on NVLink (a DGX-1), with the calibrated
# links the V100 rows use: one depth and twice that, where an 8-stage pipeline meets
# GPT-2's head
LM_WORKLOADS = ("GPT-2 124M", "Llama-style 0.95B")
LM_CLUSTERS = ("A:1x4", "B:1x8")


def staleness_of(system: str, result: SimResult) -> int:
    """The simulated schedule's weight staleness in minibatches, read off the actions of
    its timeline (``weight_stash.staleness``); 0 for the schedules that flush every step
    and for data parallelism (one synchronous update per minibatch)."""
    sys_ = systems.get(system)
    if sys_.kind == "data-parallel" or sys_.stages_per_rank > 1:
        return 0
    lay = result.layout
    return max(staleness([a for _, _, a in row], lay.replicas[lay.stage_of(r)[0]])
               for r, row in enumerate(result.timeline))


def cell(prof: Profile, cl: Cluster, system: str, minibatches: int, factor: float,
         allreduce_model: AllReduceModel | None = None) -> dict:
    """One system's numbers on one profile and cluster (``{"system", "error"}`` where the
    system cannot run there, e.g. more stages than layers)."""
    prof = prof.faster(factor)  # split and planned for the device simulated
    try:
        # PipeDream's plan for the all-reduce simulated (the fitted one: its rate per level)
        plan = plan_profile(prof, allreduce_model.planner_cluster(cl)) \
            if allreduce_model is not None and system == PAPER["planned"] else None
        layout = layout_for(prof, cl, system, plan=plan)
        r = simulate_system(prof, cl, system, layout,
                            SimOptions(minibatches=minibatches,
                                       allreduce_model=allreduce_model))
    except UserInputError as e:
        return {"system": system, "error": str(e)}
    # steady state: a worker's compute per minibatch over the time per minibatch
    busy = sum(r.utilisation.values()) * r.total_s / len(r.utilisation) / r.minibatches
    out = {"system": system, "layout": r.config,
           "throughput_samples_s": r.throughput_samples_s,
           "time_per_minibatch_s": r.time_per_minibatch_s,
           "bubble": max(0.0, 1 - busy / r.time_per_minibatch_s),
           "peak_memory_bytes": max(x["total"] for x in r.peak_memory.values()),
           "bytes_per_sample": r.bytes_per_sample,
           "staleness": staleness_of(system, r),
           "stage_shares": stage_shares(prof, layout)}
    for tie in (prof.extra or {}).get("ties", [])[:1]:
        out["tie"] = tie_status(layout, system, tie["layers"])
    return out


def stage_shares(prof: Profile, layout: SimLayout) -> list[float]:
    """Each stage's share of the model's compute (forward + backward) per worker: a
    replicated stage's divided by its replicas. A straight pipeline of p stages runs at
    the pace of its largest share, so it idles at least 1 - 1/(p x largest) of the time."""
    ms = {n.node_id: n.forward_ms + n.backward_ms for n in prof.layers}
    total = sum(ms.values()) or 1.0
    per = len(layout.groups) == len(layout.replicas)  # else several stages per worker
    return [sum(ms[x] for x in g) / total / (layout.replicas[i] if per else 1)
            for i, g in enumerate(layout.groups)]


def tie_status(layout: SimLayout, system: str, layers: list[str]) -> str:
    """Where a layout puts two layers sharing one weight, and whether a run could: "one
    stage"; "synced" (two unreplicated stages of our runtime, which exchanges the tied
    gradient: ``pipedream_impl.runtime.ties``; the simulator leaves those messages out);
    "refused: replicated stage" or "refused: engine" (a peer engine keeps no tied copies
    in sync) where a run is refused."""
    on = {i for i, g in enumerate(layout.groups) for x in layers if x in g}
    if len(on) < 2:
        return "one stage"
    if not systems.get(system).syncs_ties:
        return "refused: engine"
    per = len(layout.groups) == len(layout.replicas)
    if per and any(layout.replicas[i] > 1 for i in on):
        return "refused: replicated stage"
    return "synced"


def rows(profiles: str | None, cpu_profiles: str | None, today_profiles: str | None,
         minibatches: int, progress) -> list[dict]:  # noqa: ANN001
    """One row per (workload, cluster): every compared system's cell. On the paper's
    clusters every all-reduce is the calibrated one (fitted on the paper's BSP speedups,
    ``harness.sim.calibration``, as ``reproduce table1`` uses); on preset H the ideal ring."""
    from harness.sim.calibration import fit_on
    from harness.sim.profile_source import ProfileSource
    from harness.sim.today import find_profiles

    source = ProfileSource(profiles, progress, cpu_profiles)
    source.check([label for label, _ in WORKLOADS])
    today = find_profiles(today_profiles)
    fit = fit_on(source, progress)
    out = []
    plan = []
    for label, _ in WORKLOADS:
        prof, _, factor = source.get(label)
        plan += [(label, spec, prof, factor, "V100 (paper authors')", fit.model)
                 for spec in PAPER_CLUSTERS]
    plan += [(label, spec, load_profile(today[wl]), 1.0, "H100 (ours)", None)
             for label, wl in WORKLOADS if wl in today for spec in TODAY_CLUSTERS]
    for label in LM_WORKLOADS:
        prof, where, factor = source.get(label)
        plan += [(label, spec, prof, factor, where, fit.model) for spec in LM_CLUSTERS]
    for label, spec, prof, factor, where, model in plan:
        progress.note(f"{label} on {spec}")
        cells = [cell(prof, parse_cluster(spec), s, minibatches, factor, model)
                 for s in systems.COMPARED]
        ok = [c for c in cells if "error" not in c]
        best = max((c["throughput_samples_s"] for c in ok), default=0.0)
        for c in ok:
            c["of_best"] = c["throughput_samples_s"] / best if best else 0.0
        out.append({"workload": label, "cluster": spec, "profile": where,
                    "batch": prof.batch_size,
                    "allreduce": "ideal ring" if model is None else "calibrated",
                    "parameter_bytes": sum(n.parameter_bytes for n in prof.layers),
                    "largest_layer": largest_layer(prof),
                    "repeated_layers": repeated_layers(prof),
                    "ties": (prof.extra or {}).get("ties", []), "cells": cells})
    return out


def largest_layer(prof: Profile) -> dict:
    """The layer with the most compute (forward + backward), its share and position."""
    ms = [n.forward_ms + n.backward_ms for n in prof.layers]
    i = max(range(len(ms)), key=ms.__getitem__)
    where = "first" if i == 0 else "last" if i == len(ms) - 1 else f"number {i + 1}"
    return {"id": prof.layers[i].node_id, "position": where,
            "share": ms[i] / (sum(ms) or 1.0)}


def repeated_layers(prof: Profile) -> dict | None:
    """The largest group of identical layers (one description: a transformer's blocks),
    their count and their least and largest share of the compute. They do the same work,
    so their spread is the profile's measurement noise. None without such a group."""
    ms = [n.forward_ms + n.backward_ms for n in prof.layers]
    groups: dict[str, list[float]] = {}
    for n, t in zip(prof.layers, ms, strict=True):
        groups.setdefault(n.desc, []).append(t / (sum(ms) or 1.0))
    same = max(groups.values(), key=len)
    return ({"count": len(same), "min_share": min(same), "max_share": max(same)}
            if len(same) > 1 else None)


def straight_cells(cells: list[dict]) -> list[dict]:
    """The cells that ran a straight pipeline of one stage per worker (the planner's
    straight split, the same for every such schedule of a row)."""
    return [c for c in cells if "error" not in c and systems.get(c["system"]).straight
            and systems.get(c["system"]).stages_per_rank == 1]


def plot(table: list[dict], path: str) -> None:
    """Throughput relative to each row's best, and peak memory per worker, per schedule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(systems.COMPARED)
    labels = [f"{r['workload']}\n{r['cluster']}" for r in table]
    fig, axes = plt.subplots(2, 1, figsize=(max(10, 1.1 * len(table)), 8), sharex=True)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs, thr, mem = [], [], []
        for j, r in enumerate(table):
            c = next(c for c in r["cells"] if c["system"] == name)
            if "error" not in c:
                xs.append(j + (i - len(names) / 2) * width)
                thr.append(c["of_best"])
                mem.append(c["peak_memory_bytes"] / 2**30)
        axes[0].bar(xs, thr, width, label=name)
        axes[1].bar(xs, mem, width, label=name)
    axes[0].set_ylabel("throughput / row's best")
    axes[1].set_ylabel("peak memory per worker (GiB)")
    axes[1].set_yscale("log")
    axes[1].set_xticks(range(len(table)))
    axes[1].set_xticklabels(labels, fontsize=8)
    axes[0].legend(ncol=5, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(table: list[dict], path: str) -> None:
    Path(path).write_text(json.dumps(table, indent=1) + "\n")
