"""harness/sim/costs.py ``memory_per_worker``: stashed weight versions and in-flight
activations against the 1F1B closed form, counts read by hand off the schedule, and the
runtime's measured ``stash_weight_bytes`` and ``stash_activation_bytes`` for the same
layout (with ``--recompute`` too); the committed GPT memory table against its profiles."""

from __future__ import annotations

import pytest
import torch

from harness import systems
from harness.sim.costs import StageCost, memory_per_worker
from harness.sim.simulator import SimLayout, SimOptions, build_schedule, simulate_system
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile
from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
from pipedream_impl.runtime.local import local_executors, run_local
from pipedream_impl.schedule import Layout, gpipe, one_f_one_b
from workloads.registry import get

P, A = 4e6, 1e6  # parameter and activation bytes of every stage


def _stages(n: int) -> list[StageCost]:
    return [StageCost((f"n{i}",), 0.01, 0.02, P, A, A) for i in range(n)]


def _stashed(sched, n_stages: int) -> list[float]:  # noqa: ANN001
    return [m["stashed_weights"] for m in memory_per_worker(sched, _stages(n_stages), 1.0,
                                                             0).values()]


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_pure_data_parallelism_stashes_nothing(workers: int) -> None:
    """One replicated stage: each forward's backward comes before the update, so the
    runtime runs it on the live weights. (Before the fix the model advanced its current
    version by 1 per update while versions advance by the replicas, and saw a stash.)"""
    prof = Profile((Node("n0", "Layer0", 10.0, 20.0, (A,), P),), (), batch_size=8)
    r = simulate_system(prof, Cluster((Level(workers, 1e9),)), "dp",
                        SimLayout([("n0",)], (workers,)), SimOptions(minibatches=32))
    assert [m["stashed_weights"] for m in r.peak_memory.values()] == [0.0] * workers
    assert [m["activations"] for m in r.peak_memory.values()] == [A] * workers


@pytest.mark.parametrize("n_stages", [2, 3, 4])
def test_1f1b_straight_pipeline_closed_form(n_stages: int) -> None:
    """Stage s of S: S - s minibatches in flight with S - s distinct versions (the current
    one included), each a snapshot except at the last stage (its forward runs on the live
    weights: no update before its backward)."""
    sched = one_f_one_b(Layout((1,) * n_stages), 4 * n_stages, "stash")
    mem = memory_per_worker(sched, _stages(n_stages), 0.5, 2)
    for s in range(n_stages):
        held = n_stages - s if s < n_stages - 1 else 0
        assert mem[s]["stashed_weights"] == held * P
        assert mem[s]["activations"] == (n_stages - s) * A * 0.5
        assert mem[s]["weights"] == 3 * P  # live weights + 2 optimizer slots
        assert mem[s]["total"] == 3 * P + held * P + (n_stages - s) * A * 0.5


def test_replicated_stage_counted_by_hand() -> None:
    """2-1 (see tests/pipedream_impl/runtime/test_weight_stash.py for the action list):
    each stage-0 replica holds v0 (for minibatch 2, 3) and v2 (for 4, 5) at once, both
    snapshots; the last stage runs on its live weights."""
    sched = one_f_one_b(Layout((2, 1)), 8, "stash")
    assert _stashed(sched, 2) == [2 * P, 2 * P, 0]


def test_gpipe_and_model_parallelism_stash_nothing() -> None:
    flush = gpipe(Layout((1, 1, 1)), 4, 3)
    assert _stashed(flush, 3) == [0, 0, 0]
    mem = memory_per_worker(flush, _stages(3), 1 / 3, 0)
    assert [m["activations"] for m in mem.values()] == [3 * A / 3] * 3  # 3 microbatches
    mp = one_f_one_b(Layout((1, 1, 1)), 6, "stash", in_flight=1)
    assert _stashed(mp, 3) == [0, 0, 0]


@pytest.mark.parametrize("p", [2, 3, 4])
def test_flush_and_2bw_versions_and_activations_closed_form(p: int) -> None:
    """PipeDream-Flush: one weight version (each forward's backward comes before the
    update, so it runs on the live weights: no snapshot), at most min(p - s, M)
    microbatches in flight on stage s (GPipe: all M). PipeDream-2BW: two versions on
    every stage, W(k - 1) and W(k): snapshots of both on stages before the last (the
    current one copied, as 1F1B's stash does), of W(k - 1) alone on the last; p - s
    microbatches in flight."""
    from pipedream_impl.schedule import one_f_one_b_flush, two_bw

    for m in sorted({max(1, p - 1), p, 2 * p}):
        flush = memory_per_worker(one_f_one_b_flush(Layout((1,) * p), 3, m), _stages(p),
                                  1 / m, 0)
        delayed = memory_per_worker(two_bw(Layout((1,) * p), 3, m), _stages(p), 1 / m, 0)
        for s in range(p):
            assert flush[s]["weight_versions"] == 1 and flush[s]["stashed_weights"] == 0
            assert flush[s]["activations"] == pytest.approx(min(p - s, m) * A / m)
            assert delayed[s]["weight_versions"] == 2
            assert delayed[s]["stashed_weights"] == (2 if s < p - 1 else 1) * P
            assert delayed[s]["activations"] == pytest.approx((p - s) * A / m)
        gp = memory_per_worker(gpipe(Layout((1,) * p), 3, m), _stages(p), 1 / m, 0)
        assert [x["activations"] for x in gp.values()] == [pytest.approx(A)] * p


WL = get("vgg16")
STEPS = 8


@pytest.mark.parametrize("system", ["pipedream", "gpipe", "model-parallel", "pipedream-flush",
                                    "pipedream-2bw"])
def test_simulated_bytes_equal_the_runtimes_measured_peak(system: str) -> None:
    """A tiny 2-stage run in one process with the runtime's own handlers: the simulator's
    stashed bytes for the same layout, with the stage's real parameter bytes, equal the
    runtime's ``stash_weight_bytes``; with the stage's real input + output bytes per unit
    as its activation bytes, its in-flight activations equal the runtime's
    ``stash_activation_bytes`` (what the runtime stores per in-flight unit)."""
    torch.set_num_threads(1)
    sys_ = systems.get(system)
    bounds, batch = ((0, 17), (17, 40)), 4
    m = 2 if sys_.microbatched else 1
    spec = WorkerSpec(0, RunSettings("vgg16", "tiny", 0, batch, max_steps=STEPS,
                                     timeout_s=60.0),
                      SystemSettings((1, 1), bounds, schedule=sys_.schedule,
                                     in_flight=sys_.in_flight, microbatches=m))
    executors = local_executors(spec)
    reports = run_local(executors, 0)
    splits = WL.default_data("tiny", 0)
    x = WL.make_batch(splits.train, torch.arange(batch // m)).inputs
    stages = []
    for ex in executors:
        with torch.no_grad():
            out = ex.module(x)
        io = sum(t.numel() * t.element_size() for t in (*x, *out))
        pbytes = sum(p.numel() * p.element_size() for p in ex.module.parameters())
        stages.append(StageCost((), 0.0, 0.0, pbytes, io, 0.0))
        x = out
    mem = memory_per_worker(build_schedule(sys_, (1, 1), STEPS, m), stages, 1.0, 0)
    assert [mem[r]["stashed_weights"] for r in range(2)] == \
        [rep.stash_weight_bytes for rep in reports]
    assert [mem[r]["activations"] for r in range(2)] == \
        [rep.stash_activation_bytes for rep in reports]
    if system == "pipedream":
        assert reports[0].stash_weight_bytes == 2 * stages[0].parameter_bytes > 0


@pytest.mark.parametrize("system", ["gpipe", "pipedream-flush"])
def test_recompute_keeps_the_inputs_in_flight(system: str) -> None:
    """With ``--recompute`` a stage keeps its inputs in flight (the simulator's peak units),
    plus, on a stage that sends, the output of the unit just computed until it is sent;
    a last stage keeps no output (it recomputes it at backward time): the rule
    ``scripts/memory_table.py`` applies to profiles (``results/memory-gpt-tiny.md``)."""
    torch.set_num_threads(1)
    sys_ = systems.get(system)
    bounds, batch, m = ((0, 17), (17, 40)), 4, 2
    spec = WorkerSpec(0, RunSettings("vgg16", "tiny", 0, batch, max_steps=STEPS,
                                     timeout_s=60.0),
                      SystemSettings((1, 1), bounds, schedule=sys_.schedule,
                                     microbatches=m, recompute=True))
    executors = local_executors(spec)
    reports = run_local(executors, 0)
    x = WL.make_batch(WL.default_data("tiny", 0).train, torch.arange(batch // m)).inputs
    expected = []
    units = memory_per_worker(build_schedule(sys_, (1, 1), STEPS, m),
                              [StageCost((), 0.0, 0.0, 0.0, 1.0, 0.0)] * 2, 1.0, 0)
    for rank, ex in enumerate(executors):
        with torch.no_grad():
            out = ex.module(x)
        held = sum(t.numel() * t.element_size() for t in x) * units[rank]["activations"]
        if rank == 0:  # the stage that sends
            held += sum(t.numel() * t.element_size() for t in out)
        expected.append(held)
        x = out
    assert [rep.stash_activation_bytes for rep in reports] == expected


def test_the_committed_memory_table_is_what_its_profiles_give() -> None:
    """results/memory-gpt-tiny.md: its simulated full-scale table is what
    scripts/memory_table.py computes from the committed GPT-2 124M profile today, and every
    tiny row's measured bytes equal the simulated boundary bytes, as the file says."""
    from pathlib import Path

    from core.markdown import markdown_table
    from tests.scripts import load_script

    root = Path(__file__).resolve().parents[3]
    script = load_script("memory_table")
    text = (root / "results" / "memory-gpt-tiny.md").read_text()
    steps = int(text.split("--steps ")[1].split()[0])
    rows = script._full_scale(steps)
    assert all(line in text for line in markdown_table(["x"] * 7, rows)[2:])
    tiny = [line.split(" | ") for line in text.splitlines() if line.startswith("| gpt")]
    assert len(tiny) == 2 * len(script.WORKLOADS) * len(script.SYSTEMS)
    assert all(cells[4] == cells[5] and cells[7] in (cells[8], "not allowed")
               for cells in tiny)
