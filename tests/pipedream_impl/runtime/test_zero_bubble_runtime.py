"""ZB-H1 executed by our runtime (in one process with its own handlers, and on real gloo
processes): its split backward (I, then W later) computes the same update as
single-process training on whole minibatches."""

from __future__ import annotations

import pytest
import torch

from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
from pipedream_impl.runtime.local import local_executors, run_local
from tests.pipeline_reference import close, single_process_reference, train_two_workers
from workloads.registry import get

WL = get("vgg16")
STEPS, BATCH = 6, 32
BOUNDS3 = ((0, 10), (10, 25), (25, 40))


@pytest.fixture(scope="module")
def splits():
    return WL.default_data("tiny", 0)


@pytest.fixture(scope="module")
def sequential(splits):
    return single_process_reference(WL, splits, STEPS)[0]


def test_in_process_zb_h1_is_whole_minibatch_training(sequential) -> None:
    """Three stages, four microbatches: stage 2 defers two W's, stage 1 one; the weights
    equal single-process training, and every unit's record is released after its W."""
    torch.set_num_threads(1)
    spec = WorkerSpec(0, RunSettings("vgg16", "tiny", 0, BATCH, max_steps=STEPS,
                                     timeout_s=60.0),
                      SystemSettings((1, 1, 1), BOUNDS3, schedule="zb-h1", microbatches=4))
    executors = local_executors(spec)
    reports = run_local(executors, 0)
    assert len(reports[-1].losses) == STEPS * 4
    for ex, (a, b) in zip(executors, BOUNDS3, strict=True):
        assert close(ex.module, sequential.stage(a, b))
        assert not ex.inflight


@pytest.mark.multiprocess
def test_zb_h1_processes_equal_whole_minibatch_training(splits, sequential) -> None:
    assert close(train_two_workers(WL, splits, "zb-h1", STEPS, microbatches=4), sequential)
