"""harness/reporting/tracking.py with harness/reporting/fallback.py: a run never dies of its
tracking server. An unreachable (closed port) or failing (503) server is detected within
seconds and the run lands in the local store, tagged with the server it was meant for; a
real ``mlflow server`` killed in the middle of a suite-shaped tree of runs leaves every
metric, artifact and parent link in the local store (and, restarted, gets them back by
sync, its partial runs ended and pointing at the copies); Ctrl-C ends a run KILLED, an
exception FAILED with what was logged kept; ``resume_run_id`` continues a run's history;
``pipebench run`` trains through a dead server."""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.paths import REPO
from harness.reporting import fallback, tracking
from tests.harness.reporting.mlflow_server import MlflowServer, free_port


@pytest.fixture(autouse=True)
def _forget_fallbacks() -> Iterator[None]:
    """Each test starts with no server left (a port may be reused by a later server)."""
    fallback.forget_fallbacks()
    yield
    fallback.forget_fallbacks()


@pytest.fixture()
def local(mlflow_uri: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session's sqlite store as the local store, created before any timing."""
    from mlflow import MlflowClient

    MlflowClient(mlflow_uri).search_experiments()  # creates the tables once (10-20 s)
    monkeypatch.setenv("PIPEBENCH_LOCAL_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    return mlflow_uri


def _client(uri: str):  # noqa: ANN202
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in _client(uri).get_metric_history(run_id, key)]


def test_an_unreachable_server_falls_back_within_seconds(
        local: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead)
    t0 = time.monotonic()
    with tracking.tracked_run("fallback-dead", "r1") as tracker:
        fallback_s = time.monotonic() - t0
        tracker.params({"workload": "vgg16"})
        for step in range(3):
            tracker.metrics({"quality": 0.1 * step}, step=step)
        tracker.text("hello", "notes/hello.txt")
    with tracking.tracked_run("fallback-dead", "r2") as second:
        second.metrics({"quality": 1.0})
    assert fallback_s < 15, fallback_s  # it was 262 s of retries before
    assert tracker.uri == local and second.uri == local
    run = _client(local).get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"workload": "vgg16"}
    assert run.data.tags[fallback.INTENDED_TAG] == dead
    assert "connection refused" in run.data.tags[fallback.REASON_TAG]
    assert _history(local, tracker.run_id, "quality") == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert [f.path for f in _client(local).list_artifacts(tracker.run_id, "notes")] == [
        "notes/hello.txt"]
    said = [line for line in capsys.readouterr().err.splitlines() if "unreachable" in line]
    assert len(said) == 1  # once per server and process, not once per run
    assert f"tracking server {dead} unreachable (connection refused after" in said[0]
    assert f"logging to {local} instead" in said[0] and f"pipebench sync --to {dead}" in said[0]


@pytest.fixture()
def failing_server() -> Iterator[str]:
    """An HTTP server that answers 503 to everything (a server whose backend is down)."""
    class Unavailable(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(503)
            self.end_headers()

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args) -> None:  # noqa: ANN002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_server_answering_5xx_falls_back(local: str, failing_server: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", failing_server)
    t0 = time.monotonic()
    with tracking.tracked_run("fallback-5xx", "r") as tracker:
        assert time.monotonic() - t0 < 15
        tracker.metrics({"quality": 0.5}, step=0)
    run = _client(local).get_run(tracker.run_id)
    assert run.data.tags[fallback.INTENDED_TAG] == failing_server
    assert run.data.tags[fallback.REASON_TAG].startswith("HTTP 503 from /health")
    assert run.data.metrics == {"quality": 0.5}


def test_ctrl_c_ends_a_run_killed_and_an_exception_failed_keeping_its_metrics(
        local: str) -> None:
    with pytest.raises(KeyboardInterrupt):
        with tracking.tracked_run("fallback-status", "interrupted") as killed:
            killed.metrics({"quality": 0.25}, step=0)
            raise KeyboardInterrupt
    with pytest.raises(ValueError, match="boom"):
        with tracking.tracked_run("fallback-status", "broken") as failed:
            failed.metrics({"quality": 0.5}, step=0)
            failed.metrics({"quality": 0.75}, step=1)
            raise ValueError("boom")
    with tracking.tracked_run("fallback-status", "fine") as fine:
        fine.metrics({"quality": 1.0}, step=0)
    client = _client(local)
    assert client.get_run(killed.run_id).info.status == "KILLED"
    assert client.get_run(failed.run_id).info.status == "FAILED"
    assert client.get_run(fine.run_id).info.status == "FINISHED"
    assert _history(local, killed.run_id, "quality") == [(0, 0.25)]
    assert _history(local, failed.run_id, "quality") == [(0, 0.5), (1, 0.75)]


def test_resume_reopens_the_run_and_its_history_continues(local: str) -> None:
    with pytest.raises(KeyboardInterrupt):  # a training stopped after two epochs
        with tracking.tracked_run("fallback-resume", "train") as first:
            first.params({"epochs": 4})
            for epoch in range(2):
                first.metrics({"train_loss": 4.0 - epoch}, step=epoch)
            raise KeyboardInterrupt
    with tracking.tracked_run("fallback-resume", "train", resume_run_id=first.run_id) as again:
        for epoch in range(2, 4):
            again.metrics({"train_loss": 4.0 - epoch}, step=epoch)
    assert again.run_id == first.run_id
    run = _client(local).get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"epochs": "4"}
    assert _history(local, first.run_id, "train_loss") == [(0, 4.0), (1, 3.0), (2, 2.0),
                                                           (3, 1.0)]
    missing = "0123456789abcdef0123456789abcdef"  # in another store, or deleted
    with tracking.tracked_run("fallback-resume", "train", resume_run_id=missing) as new:
        new.metrics({"train_loss": 1.0}, step=4)
    assert new.run_id not in (missing, first.run_id)
    assert _client(local).get_run(new.run_id).data.tags["pipebench.resumed_from"] == missing


@pytest.mark.cli
def test_a_server_killed_mid_run_leaves_every_metric_and_link_in_the_local_store(
        local: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """A suite's shape: a detached parent, a cell under it, a training run under the
    cell (with system metrics); the server dies while the training run logs."""
    server = MlflowServer(tmp_path / "server").start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    try:
        with tracking.detached_run("fallback-killed", "suite", {"pipebench.kind": "suite"}) \
                as parent:
            cell = parent.child("cell", {"pipebench.kind": "cell"})
            with tracking.tracked_run("fallback-killed", "train", parent_run_id=cell.run_id,
                                      system_metrics=True) as tracker:
                tracker.params({"workload": "vgg16", "epochs": 6})
                for step in range(3):
                    tracker.metrics({"quality": step / 10, "train_loss": 3.0 - step}, step)
                tracker.text("before the crash", "before.txt")
                on_server = (parent.run_id, cell.run_id, tracker.run_id)
                assert tracker.uri == server.uri
                server.kill()
                t0 = time.monotonic()
                tracker.metrics({"quality": 0.3, "train_loss": 0.0}, step=3)
                switch_s = time.monotonic() - t0
                for step in range(4, 6):
                    tracker.metrics({"quality": step / 10, "train_loss": 3.0 - step}, step)
                tracker.text("after the crash", "after.txt")
            cell.metrics({"throughput_samples_per_s": 12.5})
    finally:
        server.kill()
    assert switch_s < 15, switch_s
    assert tracker.uri == local and parent.uri == local and cell.uri == local
    client = _client(local)
    suite, cell_run, train = (client.get_run(r) for r in (parent.run_id, cell.run_id,
                                                          tracker.run_id))
    for run, old_id in zip((suite, cell_run, train), on_server, strict=True):
        assert run.info.status == "FINISHED"
        assert run.data.tags[fallback.INTENDED_TAG] == server.uri
        assert run.data.tags[fallback.FALLBACK_FROM_TAG] == old_id != run.info.run_id
    assert cell_run.data.tags["mlflow.parentRunId"] == parent.run_id
    assert train.data.tags["mlflow.parentRunId"] == cell.run_id
    assert train.data.params == {"workload": "vgg16", "epochs": "6"}
    assert _history(local, tracker.run_id, "quality") == [(s, s / 10) for s in range(6)]
    assert [s for s, _ in _history(local, tracker.run_id, "train_loss")] == list(range(6))
    assert {f.path for f in client.list_artifacts(tracker.run_id)} == {"before.txt",
                                                                       "after.txt"}
    assert cell_run.data.metrics == {"throughput_samples_per_s": 12.5}
    said = [line for line in capsys.readouterr().err.splitlines() if "unreachable" in line]
    assert len(said) == 1 and "during run 'train'" in said[0] and "3 open run(s)" in said[0]
    # back up: sync ends the partial runs the crash left there, pointing at their copies
    from harness.reporting.progress import quiet
    from harness.reporting.sync import SUPERSEDED_TAG, sync_runs

    server = MlflowServer(tmp_path / "server", port=server.port).start()
    try:
        report = sync_runs(server.uri, local, "fallback-killed", progress=quiet())
        remote = _client(server.uri)
        assert len(report.copied) == 3
        for copied, old_id in zip(report.copied, on_server, strict=True):
            partial = remote.get_run(old_id)
            assert partial.info.status == "KILLED"
            assert partial.data.tags[SUPERSEDED_TAG] == copied.target_id
        assert _history(server.uri, report.copied[2].target_id, "quality") == [
            (s, s / 10) for s in range(6)]
    finally:
        server.kill()


@pytest.mark.cli
def test_pipebench_run_through_a_dead_server_trains_into_the_local_store(local: str) -> None:
    import mlflow

    dead = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": dead, "PIPEBENCH_LOCAL_TRACKING_URI": local}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--workload", "vgg16",
                        "--system", "single", "--epochs", "1", "--max-steps", "2",
                        "--experiment", "fallback-cli", "--quiet"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    said = [line for line in r.stderr.splitlines() if "unreachable" in line]
    assert len(said) == 1, r.stderr
    probe_s = float(re.search(r"connection refused after ([0-9.]+) s", said[0]).group(1))
    assert probe_s < 15 and elapsed < 240, (probe_s, elapsed)  # retries alone took 262 s
    client = mlflow.MlflowClient(local)
    runs = client.search_runs([client.get_experiment_by_name("fallback-cli").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id in r.stdout
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags[fallback.INTENDED_TAG] == dead
    assert set(tracking.PARAM_KEYS) <= set(run.data.params)
    assert set(tracking.RUN_METRICS) <= set(run.data.metrics)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "quality")] == [0]
    assert {f.path for f in client.list_artifacts(run.info.run_id)} >= {"curves.png"}
