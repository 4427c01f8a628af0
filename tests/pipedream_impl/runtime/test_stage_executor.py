"""pipedream_impl/runtime/stage_executor.py and launcher.py on real gloo processes, against
single-process references."""

from __future__ import annotations

import time

import pytest
import torch

from harness.config import RunConfig
from harness.experiments.pipeline_trainer import PipelineTrainer
from harness.reporting.progress import quiet
from pipedream_impl.runtime.faults import Fault
from pipedream_impl.runtime.launcher import PipelineFailure
from pipedream_impl.schedule import Layout, one_f_one_b
from tests.pipeline_reference import simulate_pipedream, single_process_reference
from workloads.registry import get

pytestmark = pytest.mark.multiprocess

WL = get("vgg16")
STEPS = 6


@pytest.fixture(scope="module")
def splits():
    return WL.default_data("tiny", 0)


def _cfg(workers: int, **kw) -> RunConfig:
    kw = {"system": "pipedream", "timeout_s": 60, **kw}
    return RunConfig.from_flags(workload="vgg16", scale="tiny", workers=workers, threads=1,
                     max_steps_per_epoch=STEPS, epochs=1, **kw)


def _trainer(cfg: RunConfig, splits, replicas, bounds, wl=WL) -> PipelineTrainer:
    return PipelineTrainer(cfg, wl, splits, replicas, bounds, torch.device("cpu"), quiet())


def _train(splits, replicas, bounds, **kw):
    t = _trainer(_cfg(sum(replicas), **kw), splits, replicas, bounds)
    try:
        stats = t.train_epoch(0)
    finally:
        t.close()
    return t, stats


def _assert_same(a: torch.nn.Module, b: torch.nn.Module, tol: float = 1e-5) -> None:
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.allclose(pa, pb, rtol=1e-4, atol=tol), (na, (pa - pb).abs().max())


@pytest.fixture(scope="module")
def sequential(splits):
    return single_process_reference(WL, splits, STEPS)


def test_one_minibatch_in_flight_equals_single_process_training(splits, sequential) -> None:
    pipe, stats = _train(splits, (1, 1), ((0, 12), (12, 40)), system="model-parallel")
    ref_model, ref_stats = sequential
    _assert_same(pipe.model, ref_model)
    assert stats.steps == STEPS
    assert stats.train_loss == pytest.approx(ref_stats.train_loss, rel=1e-5)
    initial = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    assert not torch.allclose(next(initial.parameters()), next(pipe.model.parameters()))


@pytest.mark.parametrize("recompute", [False, True])
def test_gpipe_gradients_equal_the_whole_minibatch_in_one_process(splits, sequential,
                                                                  recompute) -> None:
    """GPipe with 4 microbatches and a flush per minibatch is synchronous SGD: after
    STEPS minibatches the weights equal single-process training on whole minibatches."""
    pipe, stats = _train(splits, (1, 1, 1), ((0, 10), (10, 25), (25, 40)), system="gpipe",
                         microbatches=4, recompute=recompute)
    ref_model, ref_stats = sequential
    _assert_same(pipe.model, ref_model)
    assert stats.steps == STEPS
    assert stats.train_loss == pytest.approx(ref_stats.train_loss, rel=1e-5)


@pytest.mark.parametrize("weights", ["stash", "vertical-sync", "none"])
def test_weights_follow_pipedreams_update_rule(splits, weights: str) -> None:
    replicas, bounds = (1, 1, 1), ((0, 10), (10, 25), (25, 40))
    pipe, _ = _train(splits, replicas, bounds, weights=weights)
    sched = one_f_one_b(Layout(replicas), STEPS, weights)
    model = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    ref = simulate_pipedream(WL, "tiny", splits, model, bounds, sched, 32, 0)
    _assert_same(pipe.model, ref)


def test_a_plans_depths_deepen_the_warm_up_and_the_weights_follow_that_schedule(splits) \
        -> None:
    """A plan's in-flight depths (``planner.depths``) reach every worker's schedule: three
    minibatches in flight on stage 0 (the default is two), and the weights are the
    reference's on that schedule, not on the default one."""
    replicas, bounds, depths = (1, 1), ((0, 20), (20, 40)), (3, 1)
    t = PipelineTrainer(_cfg(2), WL, splits, replicas, bounds, torch.device("cpu"), quiet(),
                        depths)
    try:
        t.train_epoch(0)
    finally:
        t.close()
    assert t.params["in_flight"] == "3-1"
    model = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    deep = simulate_pipedream(WL, "tiny", splits, model, bounds,
                              one_f_one_b(Layout(replicas, depths), STEPS, "stash"), 32, 0)
    default = simulate_pipedream(WL, "tiny", splits, model, bounds,
                                 one_f_one_b(Layout(replicas), STEPS, "stash"), 32, 0)
    _assert_same(t.model, deep)
    assert max((a - b).abs().max() for a, b in zip(deep.parameters(), default.parameters(),
                                                    strict=True)) > 1e-4


def test_stale_weights_differ_from_sequential_sgd(splits) -> None:
    """The reference really depends on the versions: stash != sequential SGD."""
    replicas, bounds = (1, 1, 1), ((0, 10), (10, 25), (25, 40))
    model = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    stash = simulate_pipedream(WL, "tiny", splits, model, bounds,
                               one_f_one_b(Layout(replicas), STEPS, "stash"), 32, 0)
    seq = simulate_pipedream(WL, "tiny", splits, model, bounds,
                             one_f_one_b(Layout(replicas), STEPS, "stash", in_flight=1), 32, 0)
    diff = max((a - b).abs().max() for a, b in zip(stash.parameters(), seq.parameters(),
                                                    strict=True))
    assert diff > 1e-4


def test_replicated_stage_replicas_stay_identical_and_follow_the_rule(splits) -> None:
    replicas, bounds = (2, 1), ((0, 20), (20, 40))
    pipe, _ = _train(splits, replicas, bounds)
    s0, s1 = pipe.replica_states[0], pipe.replica_states[1]
    assert s0.keys() == s1.keys()
    for k in s0:
        assert torch.equal(s0[k], s1[k]), k
    sched = one_f_one_b(Layout(replicas), STEPS, "stash")
    model = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    _assert_same(pipe.model, simulate_pipedream(WL, "tiny", splits, model, bounds, sched, 32, 0))


def test_bytes_on_every_link_equal_the_tensors_sent(splits) -> None:
    pipe, _ = _train(splits, (1, 1), ((0, 12), (12, 40)))
    model = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    batch = WL.make_batch(splits.train, torch.arange(32))
    with torch.no_grad():
        boundary = model.stage(0, 12)(batch.inputs)
    per_mb = sum(t.numel() * t.element_size() for t in boundary)
    assert pipe.metrics.links[(0, 1)] == STEPS * per_mb  # activations forward
    assert pipe.metrics.links[(1, 0)] == STEPS * per_mb  # gradients backward
    assert pipe.metrics.bytes_sent == 2 * STEPS * per_mb


def test_a_failing_worker_ends_the_job_with_its_error(splits) -> None:
    t0 = time.monotonic()
    trainer = _trainer(_cfg(2, timeout_s=20, fault=Fault("raise", 1, "F", 2)), splits, (1, 1),
                       ((0, 12), (12, 40)))
    with pytest.raises(PipelineFailure, match="(?s)rank 1 .*failed.*injected failure at F2"):
        trainer.train_epoch(0)
    assert time.monotonic() - t0 < 60
    assert all(not p.is_alive() for p in trainer.launcher.procs)


def test_sgd_momentum_and_batchnorm_follow_the_rule_too() -> None:
    """ResNet-50 tiny trains with SGD + momentum and has BatchNorm: the stash must leave
    the optimizer state to the current weights, and buffers must not break versions."""
    wl = get("resnet50")
    assert wl.spec("tiny").optimizer == "sgd"
    data = wl.default_data("tiny", 0)
    replicas, bounds = (1, 1), ((0, 10), (10, 23))
    cfg = RunConfig.from_flags(system="pipedream", workload="resnet50", scale="tiny", workers=2,
                    threads=1, max_steps_per_epoch=STEPS, epochs=1, timeout_s=60)
    t = _trainer(cfg, data, replicas, bounds, wl)
    try:
        t.train_epoch(0)
    finally:
        t.close()
    model = wl.build("tiny", {**data.train.meta, "init_seed": 0})
    ref = simulate_pipedream(wl, "tiny", data, model, bounds,
                             one_f_one_b(Layout(replicas), STEPS, "stash"), 32, 0)
    _assert_same(t.model, ref, tol=1e-4)


def test_a_worker_that_dies_silently_ends_the_job(splits) -> None:
    """No traceback reported: the launcher notices the exit code and stops the others."""
    t0 = time.monotonic()
    trainer = _trainer(_cfg(2, timeout_s=20), splits, (1, 1), ((0, 12), (12, 40)))
    trainer.launcher.procs[1].kill()
    trainer.launcher.procs[1].join()
    with pytest.raises(PipelineFailure, match="rank 1: killed by SIGKILL"):
        trainer.train_epoch(0)
    assert time.monotonic() - t0 < 60
    assert all(not p.is_alive() for p in trainer.launcher.procs)


@pytest.mark.parametrize("warmup", [0, 4])
def test_throughput_leaves_out_the_configured_warm_up(splits, warmup: int) -> None:
    """RunConfig.warmup_steps reaches the workers: the first epoch's timed samples leave
    out exactly that many minibatches (none when 0)."""
    _, stats = _train(splits, (1, 1), ((0, 12), (12, 40)), warmup_steps=warmup)
    assert stats.timed_samples == (STEPS - warmup) * WL.spec("tiny").batch_size
    assert 0 < stats.timed_s <= stats.time_s


def test_a_round_robin_last_stage_stamps_each_minibatch_once(splits) -> None:
    """The steady-state clock (``Executor.mark_done``): with the last stage on two
    replicas each minibatch completes on one of them, so a window is a round of 2; every
    minibatch after the warm-up is stamped once, in order; CPU time is counted."""
    cfg = _cfg(3)
    pipe, stats = _train(splits, (1, 2), ((0, 20), (20, 40)))
    warm = min(STEPS, cfg.warmup_steps)
    assert stats.window == 2
    assert len(stats.completions) == STEPS - max(0, warm - 1)
    assert stats.completions == sorted(stats.completions)
    assert stats.cpu_s > 0
