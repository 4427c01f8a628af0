"""pipedream_impl/runtime/torchrun_worker.py: the worker under real torchrun (2 ranks), and
the pieces it shares with baselines/horovod_worker.py (flags, sink, failure lines).
The two-machine runs are in tests/test_multinode.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipedream_impl.planner.plan import Plan, Stage
from pipedream_impl.runtime.torchrun_worker import (
    FileSink,
    describe_failure,
    run_settings,
    scripted_parser,
)


@pytest.mark.multiprocess
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


def test_flags_give_the_run_settings_with_the_workloads_batch() -> None:
    a = scripted_parser("d", out="x").parse_args(["--workload", "vgg16", "--max-steps", "3",
                                                  "--timeout", "7.5", "--lr", "0.5"])
    run = run_settings(a)
    assert (run.workload, run.scale, run.batch_size, run.max_steps) == ("vgg16", "tiny", 32, 3)
    assert (run.timeout_s, run.lr, run.data, a.out, a.epochs) == (7.5, 0.5, None, "x", 1)
    b = scripted_parser("d", out="x").parse_args(["--workload", "vgg16", "--batch-size", "8"])
    assert run_settings(b).batch_size == 8


@pytest.mark.parametrize(("last", "cause"), [
    ("RuntimeError: [pair.cc:545] Read error [10.77.0.2]:30858: Connection reset by peer.",
     "a peer worker went away"),
    ("CommTimeout: rank 0: receive of a B tensor from 1 did not complete within 10s "
     "([unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete)",
     "did not answer within --timeout"),
    ("ValueError: bad shape", None),
])
def test_a_failure_line_names_the_cause(last: str, cause: str | None) -> None:
    line = describe_failure(3, f"Traceback (most recent call last):\n  File x\n{last}\n")
    assert line.startswith("rank 3 on ") and line.endswith(last)
    assert (cause in line) if cause else line.split(" failed: ")[1] == last


def test_sink_writes_the_error_for_this_host_and_torchrun_and_skips_heartbeats(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "torchrun-error.json"))
    sink = FileSink(tmp_path / "out", 1)
    sink.put(("beat", 1, {"active": True}))
    assert list((tmp_path / "out").iterdir()) == []
    trace = "Traceback (most recent call last):\nRuntimeError: Connection closed by peer"
    sink.put(("error", 1, trace))
    summary = describe_failure(1, trace)
    assert (tmp_path / "out" / "rank1.error").read_text().splitlines()[0] == summary
    recorded = json.loads((tmp_path / "torchrun-error.json").read_text())["message"]
    assert recorded["message"] == summary  # torchrun prints the callstack: summary last
    assert recorded["extraInfo"]["py_callstack"] == f"{trace}\n{summary}"
    assert capsys.readouterr().err.rstrip().endswith(summary)
