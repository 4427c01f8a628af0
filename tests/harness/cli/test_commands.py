"""harness/cli end to end: real subprocesses, a real MLflow store, the schema's keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import REPO
from harness.reporting import tracking

pytestmark = pytest.mark.cli

PIPEBENCH = [sys.executable, "-m", "harness.cli"]


def _run(args: list[str], env_uri: str | None = None,
         unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in unset}
    if env_uri:
        env["MLFLOW_TRACKING_URI"] = env_uri
    return subprocess.run(PIPEBENCH + args, capture_output=True, text=True, env=env,
                          timeout=600, cwd=REPO)


def test_workloads_lists_every_workload() -> None:
    r = _run(["workloads"], unset=("COLUMNS",))  # pytest-xdist's workers set COLUMNS=80
    assert r.returncode == 0, r.stderr
    for name in ("vgg16", "resnet50", "gnmt8", "gnmt16", "awd-lm", "s2vt", "gpt"):
        assert name in r.stdout
    # full-scale parameter counts (published: VGG-16, ResNet-50, GPT-2 124M), counted on
    # the meta device
    assert "138.36M" in r.stdout and "25.56M" in r.stdout and "124.44M" in r.stdout
    # printed to a pipe (no terminal), no cell is cut short ("paramet…" at 80 columns)
    assert "…" not in r.stdout and "parameters (tiny / small /" in r.stdout, r.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "--workload", "bert"], "unknown workload 'bert'"),
    (["run", "--workload", "vgg16", "--scale", "huge"], "unknown scale 'huge'"),
    (["run", "--workload", "vgg16", "--data", "/no/such/dir"], "does not exist"),
    (["run", "--workload", "vgg16", "--system", "nope"], "unknown system 'nope'"),
    (["run", "--system", "torch-gpipe", "--workload", "awd-lm", "--workers", "2", "--quiet"],
     "keeps no tied copies in sync"),
    (["run", "--system", "pipedream", "--workload", "awd-lm", "--workers", "3", "--config",
      "2-1", "--quiet"], "tied stages must be unreplicated"),
    (["schedule", "--config", "2-1", "--minibatches", "5"], "multiple of 2"),
])
def test_wrong_input_is_one_line_and_exit_code_2(args: list[str], message: str) -> None:
    r = _run(args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_tiny_run_is_an_mlflow_run_with_the_schema_keys(mlflow_uri: str) -> None:
    import mlflow

    r = _run(["run", "--workload", "resnet50", "--epochs", "2", "--max-steps", "4",
              "--target", "1.01", "--experiment", "cli-test", "--quiet"], env_uri=mlflow_uri)
    assert r.returncode == 0, r.stderr
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    exp = client.get_experiment_by_name("cli-test")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_id in r.stdout
    assert set(tracking.PARAM_KEYS) <= set(run.data.params)
    assert run.data.params["system"] == "single" and run.data.params["workload"] == "resnet50"
    assert set(tracking.RUN_METRICS) <= set(run.data.metrics)
    assert tracking.peak_memory_key(0) in run.data.metrics
    assert "time_to_target_s" not in run.data.metrics  # 1.01 top-1 is unreachable
    for key in tracking.EPOCH_METRICS:
        history = client.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [0, 1], key
    assert run.data.metrics["epochs_run"] == 2
    assert run.data.metrics["peak_memory_bytes_max"] > 0


def test_reaching_the_target_logs_time_to_target(mlflow_uri: str) -> None:
    import mlflow

    r = _run(["run", "--workload", "awd-lm", "--epochs", "3", "--max-steps", "2",
              "--target", "1000", "--experiment", "cli-target", "--quiet"], env_uri=mlflow_uri)
    assert r.returncode == 0, r.stderr
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    run = client.search_runs([client.get_experiment_by_name("cli-target").experiment_id])[0]
    assert run.data.metrics["epochs_to_target"] == 1  # perplexity < 1000 after one epoch
    assert run.data.metrics["epochs_run"] == 1
    assert run.data.metrics["time_to_target_s"] > 0


def test_failed_run_is_marked_failed(mlflow_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    with pytest.raises(RuntimeError, match="boom"):
        with tracking.tracked_run("cli-failed", "x") as tracker:
            tracker.metrics({"quality": 0.5}, step=0)
            raise RuntimeError("boom")
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    run = client.search_runs([client.get_experiment_by_name("cli-failed").experiment_id])[0]
    assert run.info.status == "FAILED" and run.data.metrics["quality"] == 0.5
    assert run.data.tags[tracking.ERROR_TAG] == "RuntimeError: boom"  # says why


def test_default_store_is_sqlite_under_results(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking.default_tracking_uri()
    assert uri == f"sqlite:///{REPO / 'results' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://localhost:5000")
    assert tracking.default_tracking_uri() == "http://localhost:5000"


def test_profile_then_plan_through_files(tmp_path: Path, mlflow_uri: str) -> None:
    import json

    prof = tmp_path / "p.json"
    r = _run(["profile", "--workload", "s2vt", "--batch-size", "8", "--steps", "2",
              "-o", str(prof)])
    assert r.returncode == 0, r.stderr
    assert len(json.loads(prof.read_text())["layers"]) == 4
    plan = tmp_path / "plan.json"
    r = _run(["plan", "--profile", str(prof), "--cluster", "2", "--straight", "-o", str(plan)])
    assert r.returncode == 0, r.stderr
    d = json.loads(plan.read_text())
    assert d["config"] == "1-1" and d["config_label"] == "straight" and "straight" in r.stdout
    quiet = tmp_path / "quiet.json"
    r = _run(["plan", "--profile", str(prof), "--cluster", "2", "--straight", "-o", str(quiet),
              "--quiet"])
    assert r.returncode == 0 and r.stdout == "" and quiet.read_text() == plan.read_text()
    r = _run(["plan", "--profile", str(prof), "--cluster", "Q:2x2"])
    assert r.returncode == 2 and "unknown cluster preset" in r.stderr
    # a run from the plan prints each stage's prediction: the plan's own, scaled from its
    # batch (8) to the run's minibatch (16) in proportion (stage_times, layout.py)
    r = _run(["run", "--system", "pipedream", "--workload", "s2vt", "--workers", "2",
              "--plan", str(plan), "--batch-size", "16", "--epochs", "1", "--max-steps", "2"],
             env_uri=mlflow_uri)
    assert r.returncode == 0, r.stderr
    want = [1e3 * st["predicted_time_s"] * 16 / 8 for st in d["stages"]]
    got = " ".join((r.stdout + r.stderr).split())  # progress notes go to stderr
    for s, ms in enumerate(want):
        assert f"stage {s} {ms:.1f} ->" in got, (ms, got)


def test_runs_log_to_a_real_mlflow_server(tmp_path: Path) -> None:
    """MLFLOW_TRACKING_URI pointing at `mlflow server` (HTTP) instead of the sqlite file."""
    import socket
    import time
    import urllib.request

    import mlflow

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    server = subprocess.Popen(
        [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 's.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:  # wait for the server's health endpoint, not a fixed sleep
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("mlflow server did not start") from None
                time.sleep(0.5)
        r = _run(["run", "--workload", "s2vt", "--epochs", "1", "--max-steps", "2",
                  "--experiment", "server-test", "--quiet"], env_uri=uri)
        assert r.returncode == 0, r.stderr
        client = mlflow.MlflowClient(tracking_uri=uri)
        run = client.search_runs([client.get_experiment_by_name("server-test").experiment_id])[0]
        assert run.info.status == "FINISHED" and run.data.params["workload"] == "s2vt"
        assert set(tracking.RUN_METRICS) <= set(run.data.metrics)
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_pipedream_on_two_workers_reaches_the_single_worker_target(mlflow_uri: str) -> None:
    import mlflow

    from workloads.registry import get

    target = get("vgg16").spec("tiny").target
    r = _run(["run", "--system", "pipedream", "--workload", "vgg16", "--workers", "2",
              "--config", "1-1", "--experiment", "pipe-target", "--quiet"], env_uri=mlflow_uri)
    assert r.returncode == 0, r.stderr
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    run = client.search_runs([client.get_experiment_by_name("pipe-target").experiment_id])[0]
    assert run.data.metrics["best_quality"] >= target
    assert "time_to_target_s" in run.data.metrics
    assert run.data.params["system"] == "pipedream" and run.data.params["config"] == "1-1"
    for key in ("bubble_fraction_worker_0", "bubble_fraction_worker_1", "bytes_link_0_to_1",
                "stash_weight_bytes_worker_0", tracking.peak_memory_key(1)):
        assert key in run.data.metrics, key
    assert run.data.metrics["bytes_communicated_per_sample"] > 0
    for side in ("compute_ms_predicted", "compute_ms_measured"):  # stage_times.py, per stage
        assert all(run.data.metrics[f"{side}_stage_{s}"] > 0 for s in (0, 1)), side


def test_layout_for_another_worker_count_is_a_usage_error(mlflow_uri: str) -> None:
    r = _run(["run", "--system", "pipedream", "--workload", "vgg16", "--workers", "2",
              "--config", "2-1", "--quiet"], env_uri=mlflow_uri)
    assert r.returncode == 2 and "needs 3 workers but --workers is 2" in r.stderr


def test_a_worker_failure_fails_the_run_and_the_mlflow_run(mlflow_uri: str) -> None:
    import mlflow

    r = _run(["run", "--system", "pipedream", "--workload", "vgg16", "--workers", "2",
              "--config", "1-1", "--epochs", "3", "--inject-fault", "raise:1:F30",
              "--timeout", "20", "--experiment", "pipe-fail", "--quiet"], env_uri=mlflow_uri)
    assert r.returncode == 1
    assert "worker rank 1 (stage 1, F30 of epoch 0) failed" in r.stderr
    assert "injected failure at F30 of epoch 0" in r.stderr
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    run = client.search_runs([client.get_experiment_by_name("pipe-fail").experiment_id])[0]
    assert run.info.status == "FAILED"
    assert run.data.params["system"] == "pipedream"  # what was logged before the failure


def test_compare_run_is_a_parent_run_with_one_child_per_system(mlflow_uri: str,
                                                                tmp_path: Path) -> None:
    import mlflow

    out = tmp_path / "cmp.md"
    systems = ["single", "gpipe", "horovod", "ddp", "torch-1f1b"]
    r = _run(["compare-run", "--workload", "vgg16", "--workers", "2", "--epochs", "1",
              "--max-steps", "6", "--systems", ",".join(systems), "--experiment", "cmp",
              "--quiet", "-o", str(out)], env_uri=mlflow_uri)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", r.stdout  # --quiet with -o: the file is the result
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("cmp").experiment_id])
    parent = next(x for x in runs if x.data.params.get("kind") == "comparison")
    children = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(c.data.params["system"] for c in children) == sorted(systems)
    by = {c.data.params["system"]: c for c in children}
    # the flush pipeline ran the straight plan; both data-parallel systems reduce the same
    # gradients, so their bytes per sample are equal; single sends nothing
    assert by["gpipe"].data.params["config"] == "1-1"
    dp = [by[s].data.metrics["bytes_communicated_per_sample"] for s in ("horovod", "ddp")]
    assert dp[0] == dp[1] > 0
    assert by["single"].data.metrics["bytes_communicated_per_sample"] == 0
    assert by["single"].data.params["threads"] == "2"  # the whole thread budget
    table = out.read_text()
    assert table.count("\n| ") == len(systems) + 1  # header + one row per system
    gp = by["gpipe"].data.metrics
    assert "| gpipe | 1-1 | " in table and f"{gp['throughput_samples_per_s']:.0f}" in table


def test_compare_run_says_why_a_peer_cannot_run_a_workload(mlflow_uri: str) -> None:
    # AWD-LM ties its embedding (first layer) to its decoder (last): every 2-stage split
    # puts the tie on two stages, and torch's engine keeps no tied copies in sync
    r = _run(["compare-run", "--workload", "awd-lm", "--workers", "2", "--epochs", "1",
              "--max-steps", "2", "--systems", "torch-gpipe", "--experiment", "cmp2",
              "--quiet", "-o", "/dev/stdout"], env_uri=mlflow_uri)
    assert r.returncode == 0, r.stderr
    assert "n/a: this split puts a tied parameter" in r.stdout
