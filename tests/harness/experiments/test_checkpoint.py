"""harness/experiments/checkpoint.py: checkpoints are atomic, and a resumed run ends with the
same weights, bit for bit, as the uninterrupted run (per system, CPU, fixed seed).

The reference is the uninterrupted run itself: 2 epochs straight through, checkpointed after
each. The resumed run starts from the state after epoch 1 (a separate 1-epoch run for
pipedream; the uninterrupted run's epoch-1 checkpoint for the others, which is the same
state) and trains epoch 2 in new worker processes. Every tensor of every rank's state
(weights, optimizer state, stashed weight versions) and of the evaluation model must be
equal, and epoch 2 must have changed the weights (so the comparison can fail).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from core.errors import UserInputError
from harness.config import RunConfig
from harness.experiments import checkpoint
from harness.experiments.runner import run
from harness.experiments.training import EpochStats, RunSummary
from harness.reporting.progress import quiet
from pipedream_impl.planner.plan import Plan, Stage
from pipedream_impl.runtime.contract import flat_tensors


def _state(path: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.pt")):
        out.update(flat_tensors(torch.load(f, weights_only=False), f.stem))
    return out


def _copy_epoch(src: Path, dst: Path, name: str) -> None:
    dst.mkdir(parents=True)
    shutil.copytree(src / name, dst / name)
    (dst / "latest").write_text(name + "\n")


CASES = {  # system, extra settings (pipelines: a 2-stage plan file, so both runs split alike)
    "pipedream": ("pipedream", {}),
    "pipedream-vertical-sync": ("pipedream", {"weights": "vertical-sync"}),
    "gpipe": ("gpipe", {"microbatches": 4}),
    "ddp": ("ddp", {}),
    "horovod": ("horovod", {}),
    "single": ("single", {"workers": 1}),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", list(CASES))
def test_resumed_run_equals_uninterrupted_bit_for_bit(case: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEBENCH_TRACKING", "off")
    system, extra = CASES[case]
    if system in ("pipedream", "gpipe"):
        plan = Plan((Stage((0, 12), 1, (0,), 0.0), Stage((12, 40), 1, (1,), 0.0)), 2, {})
        (tmp_path / "plan.json").write_text(plan.to_json())
        extra = {**extra, "plan": str(tmp_path / "plan.json")}
    base = {"system": system, "workload": "vgg16", "workers": 2, "threads": 1,
            "max_steps_per_epoch": 4, "seed": 1, "target": 2.0, **extra}  # target: never
    whole, part = tmp_path / "whole", tmp_path / "part"
    run(RunConfig.from_flags(epochs=2, checkpoint_dir=str(whole), **base), quiet())
    if case == "pipedream":  # a run that really stopped after epoch 1
        run(RunConfig.from_flags(epochs=1, checkpoint_dir=str(part), **base), quiet())
    else:
        _copy_epoch(whole, part, "epoch-0001")
    ckpt = checkpoint.load(part)
    assert ckpt.epochs_done == 1
    cfg = checkpoint.resume_config(ckpt, epochs=2, checkpoint_dir=str(part))
    summary = run(cfg, quiet(), resume=ckpt)
    assert len(summary.epochs) == 2 and len(summary.qualities) == 2

    expected, got = _state(whole / "epoch-0002"), _state(part / "epoch-0002")
    assert expected.keys() == got.keys() and expected
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, f"resumed state differs in {different[:5]}"
    after_1 = _state(whole / "epoch-0001")
    assert any(not torch.equal(after_1[k], expected[k]) for k in expected
               if k in after_1 and expected[k].is_floating_point())  # epoch 2 trained


def _summary(epochs: int) -> RunSummary:
    cfg = RunConfig.from_flags(system="single", workload="vgg16", epochs=5)
    s = RunSummary(cfg, "top1", 0.9)
    s.epochs = [EpochStats(loss_sum=1.0, steps=1, samples=32) for _ in range(epochs)]
    s.qualities = [0.1 * (e + 1) for e in range(epochs)]
    s.elapsed_s = [1.5 * (e + 1) for e in range(epochs)]
    return s


def test_checkpoints_are_atomic_and_the_two_newest_are_kept(tmp_path: Path) -> None:
    cfg = RunConfig.from_flags(
        system="single", workload="vgg16", epochs=5, checkpoint_dir=str(tmp_path))
    for done in (1, 2, 3):
        checkpoint.save(tmp_path, cfg, _summary(done), "run-1", [{"w": torch.ones(2) * done}],
                        {})
    assert sorted(p.name for p in tmp_path.glob("epoch-*")) == ["epoch-0002", "epoch-0003"]
    # a crash while writing epoch 4: its temporary directory exists, 'latest' is untouched
    (tmp_path / ".epoch-0004.tmp-123").mkdir()
    (tmp_path / ".epoch-0004.tmp-123" / "rank0.pt").write_bytes(b"half a file")
    ckpt = checkpoint.load(tmp_path)
    assert ckpt.epochs_done == 3 and ckpt.run_id == "run-1"
    # saving an epoch already on disk only points 'latest' at it (an interrupted save)
    (tmp_path / "latest").write_text("epoch-0002\n")
    checkpoint.save(tmp_path, cfg, _summary(3), "run-1", [{"w": torch.zeros(2)}], {})
    assert (tmp_path / "latest").read_text().strip() == "epoch-0003"
    assert torch.equal(ckpt.worker_states()[0]["w"], torch.ones(2) * 3)
    resumed = ckpt.summary(cfg, "top1", 0.9)
    assert resumed.qualities == pytest.approx([0.1, 0.2, 0.3])
    assert resumed.elapsed_s == [1.5, 3.0, 4.5] and len(resumed.epochs) == 3


def test_resume_errors_are_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no such directory"):
        checkpoint.load(tmp_path / "missing")
    with pytest.raises(UserInputError, match="no checkpoint there"):
        checkpoint.load(tmp_path)
    cfg = RunConfig.from_flags(system="single", workload="vgg16", epochs=5)
    checkpoint.save(tmp_path, cfg, _summary(3), None, [{}], {})
    for epochs in (2, 3):  # nothing left to train
        with pytest.raises(UserInputError, match=f"3 epochs done, the budget is {epochs}"):
            checkpoint.resume_config(checkpoint.load(tmp_path), epochs=epochs)
    assert checkpoint.resume_config(checkpoint.load(tmp_path), epochs=7).epochs == 7
    with pytest.raises(UserInputError, match="already holds a run's checkpoints"):
        checkpoint.prepare(tmp_path, resuming=False)  # a new run would mix its epochs in
    checkpoint.prepare(tmp_path, resuming=True)
    (tmp_path / "epoch-0003" / "rank0.pt").write_bytes(b"torn")
    with pytest.raises(UserInputError, match="rank0.pt is missing or damaged"):
        checkpoint.load(tmp_path).worker_states()
