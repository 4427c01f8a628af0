"""Ctrl-C and SIGTERM through the real ``pipebench run``: every worker stops, the MLflow run
is KILLED, nothing is left running; SIGTERM also writes the newest finished epoch's
checkpoint, and ``--resume`` then continues into the same MLflow run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.paths import REPO

pytestmark = pytest.mark.cli
PIPEBENCH = [sys.executable, "-m", "harness.cli"]
RUN = ["run", "--system", "pipedream", "--workload", "vgg16", "--workers", "2",
       "--config", "1-1", "--threads", "1", "--max-steps", "6", "--target", "2"]


def _foreground() -> None:
    """What a shell does for a foreground job: Ctrl-C at its default disposition. A child
    inherits an ignored SIGINT, and Python then installs no KeyboardInterrupt handler: once
    under `make test` (xdist) a run took this test's SIGINT and trained all 50 epochs."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], uri: str) -> subprocess.Popen:
    """``pipebench`` in its own process group, as a shell starts a foreground job."""
    return subprocess.Popen(PIPEBENCH + args, cwd=REPO, env={**os.environ,
                            "MLFLOW_TRACKING_URI": uri}, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_foreground)


def _wait_for_line(proc: subprocess.Popen, needle: str, timeout_s: float = 300) -> list[str]:
    """Read the progress output until a line contains ``needle`` (no sleeping)."""
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"never printed {needle!r}:\n{''.join(seen)}")


def _group_alive(pgid: int, within_s: float = 10.0) -> list[str]:
    """Processes of the job's group still running ``within_s`` after it ended (processes
    already on their way out get that long to go)."""
    deadline = time.monotonic() + within_s
    while True:
        out = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])}")
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.2)  # polling a condition, with a deadline


def _runs(uri: str, experiment: str) -> list:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


def test_ctrl_c_stops_every_worker_and_marks_the_run_killed(mlflow_uri: str) -> None:
    proc = _start(RUN + ["--epochs", "50", "--experiment", "ctrl-c"], mlflow_uri)
    _wait_for_line(proc, "epoch 1/50")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends the foreground job
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted (Ctrl-C): every worker was stopped" in err and "Traceback" not in err
    assert _group_alive(proc.pid) == []
    (run,) = _runs(mlflow_uri, "ctrl-c")
    assert run.info.status == "KILLED"
    assert "quality" in run.data.metrics  # the first epoch's metrics were kept


def test_sigterm_checkpoints_and_resume_continues_the_same_run(mlflow_uri: str,
                                                                tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = RUN + ["--epochs", "3", "--experiment", "sigterm", "--checkpoint-dir", str(ckpt),
                  "--checkpoint-every-epochs", "5"]  # nothing saved before the signal
    proc = _start(args, mlflow_uri)
    _wait_for_line(proc, "epoch 1/3")
    assert not (ckpt / "latest").exists()
    os.kill(proc.pid, signal.SIGTERM)  # a scheduler's "time is up", to the launcher only
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "terminated by signal SIGTERM" in err
    assert (ckpt / "latest").read_text().strip() == "epoch-0001"  # written on SIGTERM
    assert _group_alive(proc.pid) == []
    (run,) = _runs(mlflow_uri, "sigterm")
    assert run.info.status == "KILLED"

    r = subprocess.run(PIPEBENCH + ["run", "--resume", str(ckpt), "--quiet"], cwd=REPO,
                       env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    (again,) = _runs(mlflow_uri, "sigterm")  # the same run, continued
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    import mlflow

    history = mlflow.MlflowClient(tracking_uri=mlflow_uri).get_metric_history(
        run.info.run_id, "quality")
    assert sorted(m.step for m in history) == [0, 1, 2]
    assert again.data.metrics["epochs_run"] == 3
