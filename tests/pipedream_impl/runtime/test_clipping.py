"""pipedream_impl/runtime/clipping.py: pipelines that update at one point clip by the whole
model's norm, as one process does; checked against one process's training with
``clip_grad_norm_`` on steps where the clip acts (each stage's own norm would not do)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from pipedream_impl.runtime.clipping import clips_globally
from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
from pipedream_impl.runtime.local import local_executors, run_local
from tests.pipeline_reference import assert_close, assert_same, microbatch_mean_reference
from workloads.registry import get

WL = get("gnmt8")  # no dropout at tiny scale: ranks sharing one process's random stream agree
STEPS = 6
CLIP = 0.2  # below tiny GNMT-8's whole-model gradient norms from the first step


@pytest.fixture(scope="module")
def splits():
    return WL.default_data("tiny", 0)


def _bounds(splits) -> tuple[tuple[int, int], ...]:
    n = len(WL.build("tiny", splits.train.meta).layers)
    return (0, n // 2), (n // 2, n)


def _assert_stages_equal(stage_states: list[dict], model: nn.Module, bounds) -> None:
    for state, (a, b) in zip(stage_states, bounds, strict=True):
        for name, p in model.stage(a, b).named_parameters():
            assert_close(name, state[name], p)


def test_which_systems_clip_by_the_whole_models_norm() -> None:
    for flush in ("flush", "1f1b-flush", "zb-h1", "custom", "interleaved-1f1b", "zbv"):
        assert clips_globally(flush, None, (1, 1), 5.0)
    assert clips_globally("1f1b", 1, (1, 1, 1), 5.0)  # model parallelism
    assert not clips_globally("1f1b", None, (1, 1), 5.0)  # PipeDream: asynchronous updates
    assert not clips_globally("1f1b", 1, (2, 1), 5.0)  # replicas update at other points
    assert not clips_globally("2bw", None, (1, 1), 5.0)  # no flush
    assert not clips_globally("flush", None, (1, 1), None)  # the workload does not clip


@pytest.mark.parametrize("schedule, in_flight, micro", [("1f1b", 1, 1), ("flush", None, 2),
                                                         ("1f1b-flush", None, 2)])
def test_in_process_pipeline_clips_as_one_process(splits, monkeypatch, schedule: str,
                                                  in_flight: int | None, micro: int) -> None:
    """Model parallelism and two flush schedules, every rank in this process (the norm
    summed on ``LocalComm``'s board): the weights of one process's clipped training."""
    torch.set_num_threads(1)
    monkeypatch.setitem(WL.scales, "tiny",
                        dataclasses.replace(WL.spec("tiny"), grad_clip=CLIP))
    bounds = _bounds(splits)
    spec = WorkerSpec(0, RunSettings("gnmt8", "tiny", 0, 32, max_steps=STEPS, timeout_s=60.0),
                      SystemSettings((1, 1), bounds, schedule=schedule, in_flight=in_flight,
                                     microbatches=micro))
    executors = local_executors(spec)
    assert all(ex.clip_globally for ex in executors)
    run_local(executors, 0)
    want, norms = microbatch_mean_reference(WL, splits, STEPS, micro, clip=CLIP)
    assert min(norms) > CLIP  # the clip acts on every step
    _assert_stages_equal([ex.module.state_dict() for ex in executors], want, bounds)


@pytest.mark.multiprocess
@pytest.mark.parametrize("system", ["gpipe", "torch-1f1b"])
def test_two_processes_clip_as_one_process(splits, system: str) -> None:
    """Our GPipe (``Comm.norm_sum``) and torch's 1F1B (``world_sum``) on two gloo
    processes, at a learning rate that drives tiny GNMT-8's gradient norm past its clip
    (5.0) within 4 steps: the weights of one process's clipped training (clipping each
    stage by its own norm ends 0.15 away from them)."""
    from harness.config import RunConfig
    from harness.experiments.pipeline_trainer import PipelineTrainer
    from harness.reporting.progress import quiet

    steps, lr, bounds = 4, 0.15, _bounds(splits)
    cfg = RunConfig.from_flags(system=system, workload="gnmt8", workers=2, threads=1,
                               max_steps_per_epoch=steps, epochs=1, timeout_s=60,
                               microbatches=4, lr=lr)
    pipe = PipelineTrainer(cfg, WL, splits, (1, 1), bounds, torch.device("cpu"), quiet())
    try:
        pipe.train_epoch(0)
    finally:
        pipe.close()
    if system == "gpipe":  # the norm's sum is booked as a wait on the others (A), not U
        for r in (0, 1):
            assert 0 < pipe.metrics.action_s[r]["A"] <= pipe.metrics.idle[r]
    want, norms = microbatch_mean_reference(WL, splits, steps, 4, lr=lr)
    assert max(norms) > WL.spec("tiny").grad_clip  # the clip acts on some step
    assert_same(pipe.model, want)
