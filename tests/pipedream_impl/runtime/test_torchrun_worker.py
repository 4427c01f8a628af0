"""pipedream_impl/runtime/torchrun_worker.py: the worker under real torchrun (2 ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipedream_impl.planner.plan import Plan, Stage

pytestmark = pytest.mark.multiprocess


def test_two_ranks_under_torchrun_train_and_report(tmp_path: Path) -> None:
    plan = Plan((Stage((0, 12), 1, (0,), 0.0), Stage((12, 40), 1, (1,), 0.0)), 2, {})
    (tmp_path / "plan.json").write_text(plan.to_json())
    from harness.experiments.pipeline_trainer import free_port

    torchrun = Path(sys.executable).parent / "torchrun"
    r = subprocess.run(
        [str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m",
         "pipedream_impl.runtime.torchrun_worker", "--workload", "vgg16", "--plan",
         str(tmp_path / "plan.json"), "--max-steps", "4", "--epochs", "2", "--timeout", "60",
         "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[3])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "out" / "rank1.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and len(rows[0]["losses"]) == 4  # 2 epochs x 4 minibatches
    first = [json.loads(x) for x in (tmp_path / "out" / "rank0.jsonl").read_text().splitlines()]
    import torch

    from workloads.registry import get

    wl = get("vgg16")
    data = wl.default_data("tiny", 0)
    model = wl.build("tiny", data.train.meta)
    with torch.no_grad():
        out = model.stage(0, 12)(wl.make_batch(data.train, torch.arange(32)).inputs)
    per_mb = sum(t.numel() * t.element_size() for t in out)
    assert first[0]["payload"] == {"0->1": 4 * per_mb}
    assert (tmp_path / "out" / "stage1_replica0.pt").exists()
