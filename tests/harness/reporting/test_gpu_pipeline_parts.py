"""scripts/gpu_pipeline.py: the trainer's step with its loss unread trains as the one that
reads it, and the script runs end to end on the CPU at tiny scale.

Why: the script runs only where a GPU is lent (minutes a session, so a script that breaks
there wastes them), and its trainer rows tell a device warming up from the per-step loss
read (results/gpu/README.md's doubt) only if the way that reads the loss once per epoch
(``training.step_loss``) takes the same steps as ``train_step``.
"""

from __future__ import annotations

import sys

import torch

from harness.experiments.training import minibatches, step_loss, train_step
from tests.scripts import load_script
from workloads import registry
from workloads.recipe import load_splits, make_optimizer

gp = load_script("gpu_pipeline")


def _trained(step) -> list[torch.Tensor]:  # noqa: ANN001
    """Tiny GNMT-8 (it clips) after three steps of ``step``, from one initialisation."""
    wl = registry.get("gnmt8")
    spec = wl.spec("tiny")
    splits = load_splits(wl, "tiny", None, 0)
    torch.manual_seed(0)
    model = wl.build("tiny", {**splits.train.meta, "init_seed": 0}).train()
    opt = make_optimizer(spec, model.parameters())
    for batch in minibatches(splits.train, wl, spec.batch_size, 0, 0, 3):
        step(model, wl, spec, opt, batch)
    return [p.detach().clone() for p in model.parameters()]


def test_the_unread_step_takes_the_read_steps_steps() -> None:
    read = _trained(train_step)
    unread = _trained(step_loss)
    assert len(read) == len(unread)
    for a, b in zip(read, unread, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(read[0], _trained(lambda *a: None)[0])  # the steps moved it


def test_the_script_runs_on_the_cpu_and_holds_pipelines_to_the_per_epoch_trainer(
        tmp_path, monkeypatch) -> None:  # noqa: ANN001
    out = tmp_path / "gpu.md"
    monkeypatch.setattr(sys, "argv", [
        "gpu_pipeline.py", "--device", "cpu", "--scale", "tiny", "--threads", "1",
        "--workloads", "vgg16", "--stages", "1,2", "--epochs", "1", "--steps", "2",
        "-o", str(out)])
    gp.main()
    rows = [[c.strip() for c in r.split("|")[1:-1]] for r in out.read_text().splitlines()
            if r.startswith("| vgg16 |")]
    ways = [r[1] for r in rows]
    assert ways == ["trainer, loss read per step", "trainer, loss read per epoch",
                    "1 stage(s)", "2 stage(s)", "trainer, loss read per epoch",
                    "trainer, loss read per step"]
    ms = {i: float(rows[i][4]) for i in (1, 4)}
    base = (ms[1] + ms[4]) / 2
    free, actions, added = (float(rows[2][i]) for i in (4, 6, 7))
    # the table rounds ms to 0.01 (the two runs' mean and the pipeline's: 0.01 ms at most
    # between them) and the added time to 1 us
    assert abs(added - 1e3 * (free - base) / actions) <= 0.5 + 1e3 * 0.01 / actions + 1e-9
