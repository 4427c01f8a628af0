"""PipeDream-Flush and PipeDream-2BW executed by the runtime (in one process with its own
handlers, and on real gloo processes) against single-process references of their update
rules: Flush is whole-minibatch SGD; 2BW is W(t+1) = W(t) - lr * grad f(W(t-1)), W(-1) =
W(0), written out here on the whole model with the workload's own optimizer."""

from __future__ import annotations

import pytest
import torch

from harness.config import RunConfig
from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
from pipedream_impl.runtime.local import local_executors, run_local
from tests.pipeline_reference import (
    close,
    single_process_reference,
    train_two_workers,
    two_bw_reference,
)
from workloads.base import LayerModel
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


@pytest.fixture(scope="module")
def delayed(splits) -> LayerModel:
    return two_bw_reference(WL, splits, STEPS, BATCH)


def _in_process(schedule: str, microbatches: int) -> list:
    torch.set_num_threads(1)
    spec = WorkerSpec(0, RunSettings("vgg16", "tiny", 0, BATCH, max_steps=STEPS,
                                     timeout_s=60.0),
                      SystemSettings((1, 1, 1), BOUNDS3, schedule=schedule,
                                     microbatches=microbatches))
    executors = local_executors(spec)
    reports = run_local(executors, 0)
    assert len(reports[-1].losses) == STEPS * microbatches
    return executors


def _stages_equal(executors: list, ref: LayerModel) -> bool:
    return all(close(ex.module, ref.stage(a, b))
               for ex, (a, b) in zip(executors, BOUNDS3, strict=True))


def test_in_process_flush_is_whole_minibatch_training(sequential) -> None:
    """Three stages, four microbatches (stage 0 warms up with 3, so 1F1B really
    interleaves): the weights equal single-process training on whole minibatches."""
    assert _stages_equal(_in_process("1f1b-flush", 4), sequential)


def test_in_process_2bw_follows_its_update_rule(delayed, sequential) -> None:
    """Three stages, four microbatches (minibatch k's forwards on the last stage run after
    version k is made, yet use k - 1): 2BW's one-step-delayed rule, which is not SGD."""
    executors = _in_process("2bw", 4)
    assert _stages_equal(executors, delayed)
    assert not close(delayed, sequential)  # the rule really differs: this test can fail
    # weight versions held: W(k - 1) and a copy of W(k) on stages 0 and 1, W(k - 1) on the
    # last stage, each the stage's parameter bytes
    for ex, held in zip(executors, (2, 2, 1), strict=True):
        pbytes = sum(p.numel() * p.element_size() for p in ex.module.parameters())
        assert ex.store.peak_bytes == held * pbytes


def _run(splits, system: str, microbatches: int):
    return train_two_workers(WL, splits, system, STEPS, microbatches=microbatches)


@pytest.mark.multiprocess
def test_flush_processes_equal_whole_minibatch_training(splits, sequential) -> None:
    assert close(_run(splits, "pipedream-flush", 4), sequential)


@pytest.mark.multiprocess
def test_2bw_processes_follow_the_delayed_update_rule(splits, delayed, sequential) -> None:
    model = _run(splits, "pipedream-2bw", 2)
    assert close(model, delayed)
    assert not close(model, sequential)


def test_2bw_refuses_recompute() -> None:
    """A recomputed forward would run on the live weights, not the forward's version."""
    from core.errors import UserInputError

    with pytest.raises(UserInputError, match="--recompute: pipedream-2bw's 2bw schedule"):
        RunConfig.from_flags(system="pipedream-2bw", workload="vgg16", workers=2, recompute=True)
    RunConfig.from_flags(system="pipedream-flush", workload="vgg16", workers=2, recompute=True)
