"""pipedream_impl/runtime/contract.py: the scaffolding every executor shares."""

from __future__ import annotations

import pytest
import torch

from pipedream_impl.runtime.contract import (
    Executor,
    RunSettings,
    SystemSettings,
    WorkerPieces,
    WorkerSpec,
)
from pipedream_impl.runtime.faults import Fault


class _Counting(Executor):
    """The smallest executor: the base class's scaffolding only."""

    def __init__(self, pieces: WorkerPieces) -> None:
        super().__init__(pieces)
        self.n_steps = 6


@pytest.fixture(scope="module")
def pieces() -> WorkerPieces:
    run = RunSettings("vgg16", "tiny", 3, 32, warmup_steps=4, fault=Fault("raise", 1, "F", 2))
    spec = WorkerSpec(1, run, SystemSettings((1, 1), ((0, 12), (12, 40))))
    return WorkerPieces.build(spec, torch.device("cpu"))


def test_warm_up_ends_after_the_configured_steps(pieces: WorkerPieces) -> None:
    ex = _Counting(pieces)
    report = ex.start_epoch(0, 1, 0)
    for k in range(ex.n_steps):
        ex.mark_done(report, k)
        assert (report.warm_done_at is not None) == (k >= 3)  # warmup_steps=4: after k=3


def test_injected_failure_hits_only_its_rank_action_and_minibatch(pieces: WorkerPieces) -> None:
    ex = _Counting(pieces)
    ex.start_epoch(0, 1, 0)
    ex.begin_action("F", 1)
    ex.begin_action("B", 2)  # same minibatch, another action
    with pytest.raises(RuntimeError, match="injected failure at F2 of epoch 0"):
        ex.begin_action("F", 2)
    assert ex.progress.snapshot()["action"] == "F2"  # where the watchdog would see it
    ex.start_epoch(1, 1, 0)
    ex.begin_action("F", 2)  # another epoch


def test_each_rank_and_epoch_has_its_own_dropout_stream(pieces: WorkerPieces) -> None:
    ex = _Counting(pieces)
    draws = []
    for epoch in (0, 1):
        ex.start_epoch(epoch, 1, 0)
        draws.append(torch.rand(3))
    ex.start_epoch(0, 1, 0)
    assert torch.equal(torch.rand(3), draws[0])  # same rank and epoch: same stream
    assert not torch.equal(draws[0], draws[1])
    torch.manual_seed(3 * 7919)  # what a single process draws in epoch 0
    assert not torch.equal(torch.rand(3), draws[0])


def test_pieces_hold_the_run_seeds_model_and_the_step_count(pieces: WorkerPieces) -> None:
    reference = pieces.workload.build("tiny", {**pieces.splits.train.meta, "init_seed": 3})
    for p, q in zip(pieces.model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)
    assert pieces.steps_per_epoch() == len(pieces.splits.train) // 32
    report = _Counting(pieces).close_report(_Counting(pieces).start_epoch(0, 1, 0),
                                            pieces.model.stage(12, 40))
    assert set(report.state) == set(pieces.model.stage(12, 40).state_dict())
