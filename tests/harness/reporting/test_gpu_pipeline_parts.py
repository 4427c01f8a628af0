"""scripts/gpu_pipeline.py runs end to end on the CPU at tiny scale: its rows in the order
they ran, the pipelines held against the trainer that reads its losses once per epoch.

Why: the script runs only where a GPU is lent (minutes a session, so a script that breaks
there wastes them), and its trainer rows are to tell a device warming up from the per-step
loss read (results/gpu/README.md's doubt): both ways, before and after the pipelines. The
two ways take the same step by construction (``training.train_step`` reads what
``training.step_loss`` returns).
"""

from __future__ import annotations

import sys

from tests.scripts import load_script

gp = load_script("gpu_pipeline")


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
