"""pipedream_impl/runtime/weight_stash.py: stashed weight bytes against the weight snapshots
counted on the tensors themselves, the 1F1B closed form and counts read by hand off
``one_f_one_b``'s actions."""

from __future__ import annotations

import gc
import weakref
from collections import Counter, defaultdict

import pytest
import torch

from harness.config import RunConfig
from harness.experiments.pipeline_trainer import PipelineTrainer
from harness.reporting.progress import quiet
from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
from pipedream_impl.runtime.local import local_executors, run_local
from pipedream_impl.runtime.weight_stash import snapshots_held
from pipedream_impl.schedule import Layout, gpipe, one_f_one_b
from workloads.registry import get

WL = get("vgg16")
STEPS = 8
BOUNDS4 = ((0, 10), (10, 17), (17, 33), (33, 40))  # no parameter shape on two stages


def _versions_in_flight(acts) -> int:  # noqa: ANN001
    """The most distinct versions among minibatches between their F and their B, read off
    the schedule's own F/B versions (stash: B uses F's version)."""
    held: dict[int, int] = {}
    peak = 0
    for a in acts:
        if a.kind == "F":
            held[a.mb] = a.version
        elif a.kind == "B":
            assert held.pop(a.mb) == a.version
        peak = max(peak, len(set(held.values())))
    return peak


@pytest.mark.parametrize("n_stages", [2, 3, 4, 5])
def test_1f1b_holds_the_closed_form_count(n_stages: int) -> None:
    """Stage s of S holds S - s versions in flight, the current one included; each needs a
    snapshot except at the last stage, whose forwards see no update before their backward
    and run on the live weights."""
    sched = one_f_one_b(Layout((1,) * n_stages), 4 * n_stages, "stash")
    for s, acts in enumerate(sched.actions):
        assert _versions_in_flight(acts) == n_stages - s
        expected = n_stages - s if s < n_stages - 1 else 0
        assert max(snapshots_held(acts, "stash", 1)) == expected


def test_replicated_stage_counted_by_hand() -> None:
    """2-1, 8 minibatches. Rank 0 runs F0v0 SF0 F2v0 SF2 RB0 B0v0 A0 U0 F4v2 SF4 RB2 B2v0
    A1 U2 F6v4 SF6 RB4 B4v2 A2 U4 RB6 B6v4 A3 U6: F0 is direct (B0 before U0); F2 makes
    snapshot v0; after U0 (version 2) F4 makes v2 while F2 still holds v0 (2 alive); B2's
    gradients hold v0 until A1; and so on."""
    sched = one_f_one_b(Layout((2, 1)), 8, "stash")
    assert " ".join(map(str, sched.actions[0])).replace(">2", "").replace("<2", "") == (
        "F0v0 SF0 F2v0 SF2 RB0 B0v0 A0 U0 F4v2 SF4 RB2 B2v0 A1 U2 F6v4 SF6 RB4 B4v2 A2 U4 "
        "RB6 B6v4 A3 U6")
    assert snapshots_held(sched.actions[0], "stash", 2) == [
        0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0]
    assert max(snapshots_held(sched.actions[1], "stash", 2)) == 2  # the other replica
    assert max(snapshots_held(sched.actions[2], "stash", 1)) == 0  # last stage: direct


@pytest.mark.parametrize("build", [
    lambda: one_f_one_b(Layout((2,)), 8, "stash"),  # pure data parallelism
    lambda: one_f_one_b(Layout((4,)), 8, "stash"),
    lambda: gpipe(Layout((1, 1, 1)), 4, 3),
    lambda: one_f_one_b(Layout((1, 1, 1)), 6, "stash", in_flight=1),  # model parallelism
    lambda: one_f_one_b(Layout((1, 1, 1)), 6, "none"),  # naive: recomputes, no snapshot
])
def test_schedules_without_a_stashed_version(build) -> None:  # noqa: ANN001
    sched = build()
    for rank, acts in enumerate(sched.actions):
        step = sched.layout.replicas[sched.layout.stage_of(rank)[0]]
        assert max(snapshots_held(acts, sched.weights, step)) == 0


def _counted(shapes: Counter, extra: list[weakref.ref]) -> int:
    """Complete weight snapshots of a stage alive now, found by gc among the tensors made
    since ``gc.freeze`` (plus ``extra``, made before): plain leaf tensors that require grad
    with the stage's parameter shapes, each storage once."""
    ptrs: dict[tuple, set[int]] = defaultdict(set)
    tensors = [o for o in gc.get_objects() if type(o) is torch.Tensor]
    tensors += [r() for r in extra if r() is not None]
    for t in tensors:
        if t.is_leaf and t.requires_grad and tuple(t.shape) in shapes:
            ptrs[tuple(t.shape)].add(t.untyped_storage().data_ptr())
    return min(len(ptrs[s]) // k for s, k in shapes.items())


@pytest.mark.parametrize("weights", ["stash", "vertical-sync"])
def test_reported_bytes_are_the_snapshots_alive_at_every_action(weights: str) -> None:
    """1-1-1-1 in one process, two epochs: after every action of every rank, the snapshots
    counted by gc equal the store's stashed bytes / the stage's parameter bytes and the
    model's ``snapshots_held``; the reported peak is the largest count (before the fix,
    stage 0 reported 2 versions while 4 were alive)."""
    torch.set_num_threads(1)
    spec = WorkerSpec(0, RunSettings("vgg16", "tiny", 0, 4, max_steps=STEPS, timeout_s=60.0),
                      SystemSettings((1, 1, 1, 1), BOUNDS4, weights=weights))
    executors = local_executors(spec)
    shapes = [Counter(tuple(p.shape) for p in ex.module.parameters()) for ex in executors]
    for i, a in enumerate(shapes):  # no shape on two stages: each rank's count stays apart
        assert all(not set(a) & set(b) for b in shapes[i + 1:])
    pbytes = [sum(p.numel() * p.element_size() for p in ex.module.parameters())
              for ex in executors]
    made_before = [[weakref.ref(t) for s in ex.store.snapshots.values() for t in s.values()]
                   for ex in executors]  # vertical sync's version 0, made at start
    seen: dict[int, list[tuple[int, int, int]]] = defaultdict(list)

    def watch(ex):  # noqa: ANN001, ANN202
        run = ex.step

        def step(act, pos) -> None:  # noqa: ANN001
            run(act, pos)
            r = ex.rank
            seen[r].append((_counted(shapes[r], made_before[r]),
                            ex.store.stashed_bytes(), ex.store.peak_bytes))
        return step

    for ex in executors:
        ex.step = watch(ex)
    gc.collect()
    gc.freeze()
    try:
        reports = [run_local(executors, epoch) for epoch in (0, 1)]
    finally:
        gc.unfreeze()
    sched = one_f_one_b(Layout((1, 1, 1, 1)), STEPS, weights)
    for r in range(4):
        model = snapshots_held(sched.actions[r], weights, 1) * 2  # both epochs alike
        counted = [c for c, _, _ in seen[r]]
        assert counted == model
        assert [b for _, b, _ in seen[r]] == [c * pbytes[r] for c in counted]
        assert reports[-1][r].stash_weight_bytes == max(counted) * pbytes[r]
    peaks = [max(c for c, _, _ in seen[r]) for r in range(4)]
    assert peaks == ([4, 3, 2, 0] if weights == "stash" else [4, 4, 4, 4])


@pytest.mark.multiprocess
def test_replicated_run_reports_the_hand_count() -> None:
    """2-1 on gloo processes: each stage-0 replica holds 2 snapshots at its peak (see the
    hand count above), the last stage none."""
    splits = WL.default_data("tiny", 0)
    cfg = RunConfig.from_flags(
        workload="vgg16", scale="tiny", workers=3, threads=1, system="pipedream", timeout_s=60,
        max_steps_per_epoch=STEPS, epochs=1)
    bounds = ((0, 20), (20, 40))
    t = PipelineTrainer(cfg, WL, splits, (2, 1), bounds, torch.device("cpu"), quiet())
    try:
        t.train_epoch(0)
    finally:
        t.close()
    model = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    pbytes = [sum(p.numel() * p.element_size() for p in model.stage(a, b).parameters())
              for a, b in bounds]
    assert t.metrics.stash_weights == {0: 2 * pbytes[0], 1: 2 * pbytes[0], 2: 0}


@pytest.mark.parametrize("p", [2, 3, 4])
def test_staleness_follows_each_schedules_closed_form(p: int) -> None:
    """Stage s of a straight 1F1B pipeline keeps p - s minibatches in flight: each
    gradient lands p - 1 - s updates after its forward's version; PipeDream-2BW's delay is
    one minibatch everywhere; a flush none."""
    from pipedream_impl.runtime.weight_stash import staleness
    from pipedream_impl.schedule import Layout, gpipe, one_f_one_b, one_f_one_b_flush, two_bw

    lay = Layout((1,) * p)
    pd = one_f_one_b(lay, 4 * p)
    assert [staleness(a, 1) for a in pd.actions] == [p - 1 - s for s in range(p)]
    assert [staleness(a, 1) for a in two_bw(lay, 6, p).actions] == [1] * p
    for sched in (gpipe(lay, 4, p), one_f_one_b_flush(lay, 4, p),
                  one_f_one_b(lay, 4 * p, in_flight=1)):
        assert [staleness(a, 1) for a in sched.actions] == [0] * p


def test_staleness_counts_minibatches_on_replicated_stages() -> None:
    """2-1: stage 0's two replicas take turns (NOAM ceil(3/2) = 2 in flight each) and
    every update applies two minibatches: a gradient lands one round, two minibatches,
    after its forward's version; stage 1 (one in flight) is never stale."""
    from pipedream_impl.runtime.weight_stash import staleness
    from pipedream_impl.schedule import Layout, one_f_one_b

    sched = one_f_one_b(Layout((2, 1)), 12)
    assert [staleness(a, r) for a, r in zip(sched.actions, (2, 2, 1), strict=True)] == [2, 2, 0]
