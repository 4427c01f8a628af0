"""DDP, Horovod and the peer pipeline engines on real processes, against one process."""

from __future__ import annotations

import pytest
import torch

from harness.config import RunConfig
from harness.experiments.pipeline_trainer import PipelineTrainer
from harness.reporting.progress import quiet
from pipedream_impl.runtime.faults import Fault
from tests.pipeline_reference import assert_same, single_process_reference
from workloads.registry import get

WL = get("vgg16")
STEPS = 6


@pytest.fixture(scope="module")
def splits():
    return WL.default_data("tiny", 0)


@pytest.fixture(scope="module")
def sequential(splits):
    return single_process_reference(WL, splits, STEPS)


def _one_epoch(trainer: PipelineTrainer):  # noqa: ANN202
    try:
        return trainer.train_epoch(0)
    finally:
        trainer.close()


@pytest.mark.multiprocess
@pytest.mark.parametrize("system", ["ddp", "horovod"])
def test_data_parallel_equals_single_process_on_the_global_batch_and_counts_ring_bytes(
        splits, sequential, system: str) -> None:
    n_layers = len(WL.build("tiny", splits.train.meta).layers)
    cfg = RunConfig.from_flags(system=system, workload="vgg16", workers=2, threads=1,
                    max_steps_per_epoch=STEPS, epochs=1, timeout_s=60)
    dp = PipelineTrainer(cfg, WL, splits, (2,), ((0, n_layers),), torch.device("cpu"),
                         quiet())
    stats = _one_epoch(dp)
    ref_model, ref_stats = sequential
    assert_same(dp.model, ref_model)
    assert stats.steps == STEPS
    assert stats.train_loss == pytest.approx(ref_stats.train_loss, rel=1e-5)
    s0, s1 = dp.replica_states[0], dp.replica_states[1]
    assert all(torch.equal(s0[k], s1[k]) for k in s0)  # replicas identical
    param_bytes = sum(p.numel() * 4 for p in ref_model.parameters())
    # every gradient is all-reduced once per step (DDP: its buckets, via the comm hook;
    # Horovod: the tensors DistributedOptimizer hands it); each of 2 ranks sends
    # 2 (2-1)/2 = 1 x their bytes in a ring all-reduce
    assert dp.metrics.bytes_sent == 2 * STEPS * param_bytes
    # every rank completes every minibatch: a window is one minibatch, stamped at the later
    # rank (the steady-state clock), the warm-up's last minibatch the first stamp
    assert stats.window == 1
    assert len(stats.completions) == STEPS - max(0, min(STEPS, cfg.warmup_steps) - 1)
    assert stats.cpu_s > 0
    assert all(not p.is_alive() for p in dp.launcher.procs)


@pytest.mark.multiprocess
def test_horovod_worker_error_reaches_the_launcher(splits) -> None:
    from pipedream_impl.runtime.launcher import PipelineFailure

    n_layers = len(WL.build("tiny", splits.train.meta).layers)
    cfg = RunConfig.from_flags(system="horovod", workload="vgg16", workers=2, threads=1,
                    max_steps_per_epoch=STEPS, epochs=1, timeout_s=30,
                    fault=Fault("raise", 1, "F", 2))
    hvd = PipelineTrainer(cfg, WL, splits, (2,), ((0, n_layers),), torch.device("cpu"),
                          quiet())
    with pytest.raises(PipelineFailure, match="injected failure at F2 of epoch 0"):
        hvd.train_epoch(0)
    assert all(not p.is_alive() for p in hvd.launcher.procs)


@pytest.mark.multiprocess
@pytest.mark.parametrize("system", ["torch-gpipe", "torch-1f1b", "deepspeed-pipe"])
def test_peer_engine_equals_single_process_on_whole_minibatches(splits, sequential,
                                                                system: str) -> None:
    """Each peer flushes per minibatch and averages its 4 microbatches' gradients: after
    STEPS minibatches its weights equal single-process training (so its loss goes down
    exactly as the reference's), and its bytes are the boundary tensors, both ways."""
    bounds = ((0, 12), (12, 40))
    cfg = RunConfig.from_flags(system=system, workload="vgg16", workers=2, threads=1,
                    max_steps_per_epoch=STEPS, epochs=1, timeout_s=60, microbatches=4)
    pipe = PipelineTrainer(cfg, WL, splits, (1, 1), bounds, torch.device("cpu"), quiet())
    stats = _one_epoch(pipe)
    ref_model, ref_stats = sequential
    assert_same(pipe.model, ref_model)
    assert stats.steps == STEPS
    assert stats.train_loss == pytest.approx(ref_stats.train_loss, rel=1e-4)
    model = WL.build("tiny", splits.train.meta)
    x = WL.make_batch(splits.train, torch.arange(1)).inputs
    boundary = model.stage(0, 12)(x)[0].numel() * 4  # bytes per sample
    samples = STEPS * WL.spec("tiny").batch_size
    assert pipe.metrics.links == {(0, 1): samples * boundary, (1, 0): samples * boundary}
