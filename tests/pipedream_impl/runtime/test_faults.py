"""pipedream_impl/runtime/faults.py: the fault switch, progress boards, and the checks that
keep a fault spec to what a system's workers can do; the worker's orphan guard."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
from pathlib import Path

import pytest

from core.errors import UserInputError
from harness.config import RunConfig
from pipedream_impl.runtime.faults import Fault, Progress, board_path, read_board
from pipedream_impl.runtime.worker import _orphan_guard


def test_fault_specs_parse_and_hit_only_their_action() -> None:
    f = Fault.parse("kill:1:F3")
    assert (f.kind, f.rank, f.action, f.minibatch, f.epoch) == ("kill", 1, "F", 3, 0)
    assert Fault.parse("stall:0:SB12@2") == Fault("stall", 0, "SB", 12, 2)
    assert f.hits(1, 0, "F", 3)
    assert not f.hits(1, 0, "B", 3) and not f.hits(0, 0, "F", 3) and not f.hits(1, 1, "F", 3)
    for bad in ("kill:1", "kill:x:F3", "kill:1:3", "boom:1:F3"):
        with pytest.raises(UserInputError, match="inject-fault"):
            Fault.parse(bad)


def test_a_board_says_where_a_worker_is(tmp_path: Path) -> None:
    path = board_path(str(tmp_path), 3)
    progress = Progress(3, path)
    assert read_board(path)["action"] == "setting up"
    progress.begin_epoch(2, stage=1)
    progress.enter("RB7", waiting=True)
    state = read_board(path)
    assert (state["rank"], state["stage"], state["epoch"]) == (3, 1, 2)
    assert (state["action"], state["waiting"], state["active"]) == ("RB7", True, True)
    assert 0 <= state["age_s"] < 5
    progress.enter("F10", waiting=False)  # a shorter record over a longer one
    assert read_board(path)["action"] == "F10"
    progress.end_epoch()
    assert read_board(path)["active"] is False
    assert read_board(tmp_path / "missing") is None


@pytest.mark.parametrize(("system", "spec", "message"), [
    ("ddp", "kill:1:SF2", "ddp has no action 'SF'"),
    ("torch-gpipe", "stall:1:B2", "its workers act F"),
    ("single", "raise:0:F2", "has none"),
    ("pipedream", "raise:2:F2", "names rank 2, but the run has 2"),
])
def test_fault_specs_a_system_cannot_reach_are_refused(system: str, spec: str,
                                                        message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        RunConfig.from_flags(
            system=system, workload="vgg16", workers=1 if system == "single" else 2,
            fault=Fault.parse(spec))


def test_a_worker_exits_when_its_launcher_is_gone() -> None:
    launcher = subprocess.Popen(["sleep", "600"])
    guard = mp.get_context("spawn").Process(target=_orphan_guard, args=(launcher.pid, 0))
    guard.start()
    try:
        assert guard.exitcode is None
        launcher.kill()
        launcher.wait()
        guard.join(timeout=30)
        assert guard.exitcode == 70
    finally:
        launcher.kill()
        if guard.is_alive():
            guard.kill()
            guard.join()


def test_stall_timeout_defaults_per_scale() -> None:
    cfg = RunConfig.from_flags(system="pipedream", workload="vgg16", workers=2)
    assert cfg.stall_timeout() == 20.0
    assert RunConfig.from_flags(system="pipedream", workload="vgg16", scale="full", workers=2,
                     stall_timeout_s=7.5).stall_timeout() == 7.5
    with pytest.raises(UserInputError, match="--stall-timeout must be a positive"):
        RunConfig.from_flags(system="pipedream", workload="vgg16", workers=2, stall_timeout_s=0)


def test_a_straggler_spec_parses_and_slows_only_its_rank_and_action(monkeypatch) -> None:  # noqa: ANN001
    """``slow:RANK:ACTION:FACTOR``: the action of that rank takes FACTOR times as long
    (checked on a fake clock: the spin ends FACTOR x the action's own time after it began);
    nothing else waits."""
    from types import SimpleNamespace

    from pipedream_impl.runtime import contract

    f = Fault.parse("slow:1:F:2.5")
    assert (f.kind, f.rank, f.action, f.factor) == ("slow", 1, "F", 2.5)
    assert str(f) == "slow:1:F:2.5" and not f.hits(1, 0, "F", -1)
    every = Fault.parse("slow:*:*:1.5")  # every rank's compute: a slower machine
    assert str(every) == "slow:*:*:1.5"
    assert [every.slowdown(r, k) for r, k in ((0, "F"), (3, "W"), (1, "U"), (1, "RB"),
                                               (0, "A"))] == [1.5, 1.5, 1.5, 1.0, 1.0]
    for bad in ("slow:1:F", "slow:1:F:0.5", "slow:1:F3@1"):
        with pytest.raises(UserInputError, match="inject-fault"):
            Fault.parse(bad)
    now = [10.0]

    def clock() -> float:
        now[0] += 0.001
        return now[0]

    monkeypatch.setattr(contract.time, "perf_counter", clock)
    for rank, kind, factor in ((1, "F", 2.5), (0, "F", 1.0), (1, "B", 1.0)):
        worker = SimpleNamespace(run=SimpleNamespace(fault=f), rank=rank)
        now[0] = 11.0  # the action began at 10 and took 1 s
        contract.Executor.straggle(worker, kind, 10.0)
        assert now[0] == pytest.approx(10.0 + factor * 1.001 if factor > 1 else 11.001,
                                       abs=0.002)


@pytest.mark.multiprocess
@pytest.mark.parametrize("system", ["pipedream", "ddp"])
def test_a_straggler_slows_its_rank_s_action_in_a_real_run(system: str) -> None:
    """Two real 2-process runs, with and without ``slow:1:F:30``: rank 1's forwards take
    about thirty times as long against its backwards, rank 0's forwards and rank 1's
    backwards do not (wide margins: this checks where the fault acts, not a speed). Each
    action is measured by its thread's CPU time, which the fault's spin adds to: its wall
    time would hold waits that the machine's load stretches unevenly (make test runs two
    test files at once on 2 cores): DDP's backward holds the all-reduce, which waits on
    the other rank being scheduled, and two CI runs saw rank 1's backwards 7x and 10x
    their unloaded wall time while its forwards' compute was 1-2.4x."""
    import torch

    from harness.experiments.pipeline_trainer import PipelineTrainer
    from harness.reporting.progress import quiet
    from workloads import registry

    wl = registry.get("vgg16")
    splits = wl.default_data("tiny", 0)
    seconds = []
    for fault in (None, Fault.parse("slow:1:F:30")):
        cfg = RunConfig.from_flags(system=system, workload="vgg16", workers=2, threads=1,
                                   max_steps_per_epoch=6, epochs=1, fault=fault)
        layout = ((2,), ((0, 40),)) if system == "ddp" else ((1, 1), ((0, 12), (12, 40)))
        t = PipelineTrainer(cfg, wl, splits, *layout, torch.device("cpu"), quiet())
        try:
            t.train_epoch(0)
        finally:
            t.close()
        seconds.append({r: {kind: use[0] for kind, use in kinds.items()}  # thread CPU
                        for r, kinds in t.metrics.action_use.items()})
    plain, slow = seconds

    # each time against another measured in the same run: other processes on the machine
    # slow a run's actions alike, not one kind
    def ratio(run: dict, a: tuple[int, str], b: tuple[int, str]) -> float:
        return run[a[0]][a[1]] / run[b[0]][b[1]]

    assert ratio(slow, (1, "F"), (1, "B")) > 4 * ratio(plain, (1, "F"), (1, "B"))
    assert ratio(slow, (0, "F"), (0, "B")) < 2.5 * ratio(plain, (0, "F"), (0, "B"))
    assert ratio(slow, (1, "B"), (0, "B")) < 2.5 * ratio(plain, (1, "B"), (0, "B"))
