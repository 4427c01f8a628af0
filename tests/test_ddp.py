"""baselines/ddp.py on 2 gloo processes against one process over the global minibatch."""

from __future__ import annotations

import pytest
import torch

from harness.config import RunConfig
from harness.pipeline_system import PipelineTrainer
from harness.progress import quiet
from tests.pipeline_reference import single_process_reference
from workloads.registry import get

STEPS = 6


def test_ddp_equals_single_process_on_the_global_batch_and_counts_ring_bytes() -> None:
    wl = get("vgg16")
    splits = wl.default_data("tiny", 0)
    n_layers = len(wl.build("tiny", splits.train.meta).layers)
    cfg = RunConfig(system="ddp", workload="vgg16", workers=2, threads=1,
                    max_steps_per_epoch=STEPS, epochs=1)
    ddp = PipelineTrainer(cfg, wl, splits, (2,), ((0, n_layers),), "stash", None,
                          torch.device("cpu"), quiet(), timeout_s=60, microbatches=2,
                          executor="baselines.ddp:DDPExecutor")
    try:
        stats = ddp.train_epoch(0)
    finally:
        ddp.close()
    ref_model, ref_stats = single_process_reference(wl, splits, STEPS)
    for (name, a), b in zip(ddp.model.named_parameters(), ref_model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name
    assert stats.steps == STEPS
    assert stats.train_loss == pytest.approx(ref_stats.train_loss, rel=1e-5)
    s0, s1 = ddp.replica_states[0], ddp.replica_states[1]
    assert all(torch.equal(s0[k], s1[k]) for k in s0)  # replicas identical
    param_bytes = sum(p.numel() * 4 for p in ref_model.parameters())
    # each of 2 ranks sends 2 (2-1)/2 = 1 x every gradient byte per step
    assert ddp.metrics.bytes_sent == 2 * STEPS * param_bytes
