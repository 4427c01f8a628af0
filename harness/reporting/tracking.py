"""MLflow tracking: where runs go and the one schema every system logs.

Default store: ``sqlite:///<repo>/results/mlflow.db`` with artifacts in
``results/mlartifacts`` (no server; ``PIPEBENCH_LOCAL_TRACKING_URI`` moves it).
``MLFLOW_TRACKING_URI`` overrides it, e.g. a real ``mlflow server``. Only the launcher
process logs (SQLite takes one writer at a time). A server that is down, or dies during a
run, never loses the run: it continues in the local store (``harness.reporting.fallback``)
and ``pipebench sync`` copies it to the server later (``harness.reporting.sync``).

A run ends FINISHED, FAILED when its body raises (everything logged so far kept, and the
error's message in the ``pipebench.error`` tag) or KILLED on Ctrl-C;
``tracked_run(resume_run_id=...)`` reopens an earlier run so that a resumed training
continues its metrics.

The schema (documented in results/README.md; tests check it): keys in ``PARAM_KEYS`` are
params of every run; the metrics, ``EPOCH_METRICS`` logged each epoch with ``step=epoch``
and ``RUN_METRICS`` once at the end among them, are declared in ``harness.metrics``
(rendered into docs/metrics.md).

``PIPEBENCH_TRACKING=off`` turns tracking off: ``tracked_run`` then yields a tracker that
logs nothing and never imports mlflow (the harness-overhead measurement and machines
without mlflow use it). Training runs also record MLflow's system metrics (CPU, memory,
GPU when ``nvidia-ml-py`` sees one) every ``SYSTEM_METRICS_INTERVAL_S`` seconds.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from core.interrupts import is_interrupt
from harness import metrics
from harness.metrics import EPOCH_METRICS, RUN_METRICS
from harness.paths import REPO
from harness.reporting.fallback import (
    JournaledRun,
    artifact_dir,
    artifact_root,
    local_tracking_uri,
)

__all__ = ["ERROR_CHARS", "ERROR_TAG", "EPOCH_METRICS", "PARAM_KEYS", "RUN_METRICS",
           "SYSTEM_METRICS_INTERVAL_S",
           "artifact_root", "default_tracking_uri", "detached_run", "DetachedRun",
           "enabled", "git_sha", "hardware", "local_tracking_uri", "name_this_node",
           "peak_memory_key", "tracked_run", "Tracker"]

PARAM_KEYS = ("system", "workload", "scale", "batch_size", "global_batch_size", "workers",
              "seed", "epochs", "target", "metric", "data", "optimizer", "lr", "threads",
              "device", "hardware", "git_sha", "torch_version", "num_parameters", "warmup_steps",
              "runtime_env")
SYSTEM_METRICS_INTERVAL_S = 2.0


def name_this_node(node: str) -> None:
    """This process's system metrics go under ``system/<node>/`` (a run several nodes log
    their system metrics into: ``--launcher srun``)."""
    import mlflow

    mlflow.set_system_metrics_node_id(node)


ERROR_TAG = "pipebench.error"  # a FAILED run's error message (its end)
ERROR_CHARS = 4000  # MLflow keeps tag values up to 8000 characters


def mlflow_output_defaults() -> None:
    """MLflow prints a URL per run and a progress bar per artifact download; for a
    command's own output neither says anything (one home for both defaults; a user's own
    setting of either variable wins)."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def enabled() -> bool:
    """False when ``PIPEBENCH_TRACKING`` is off (``off``, ``0``, ``false``, ``no``)."""
    return os.environ.get("PIPEBENCH_TRACKING", "on").strip().lower() not in (
        "off", "0", "false", "no")


def peak_memory_key(rank: int) -> str:
    """The key of worker ``rank``'s peak memory (``harness.metrics.PEAK_MEMORY``)."""
    return metrics.key(metrics.PEAK_MEMORY, worker=rank)


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI``, else the local store (``local_tracking_uri``)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or local_tracking_uri()


def git_sha(untracked: bool = False) -> str:
    """The commit, ``-dirty`` where tracked files changed (``untracked``: new files count
    too, for a measurement that may run a module no commit holds)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain",
                                "--untracked-files=" + ("normal" if untracked else "no")],
                               cwd=REPO, capture_output=True, text=True, timeout=10).stdout
        return (sha or "unknown") + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def hardware(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} x{torch.cuda.device_count()}"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


class Tracker:
    """A thin wrapper over one open run (created by ``tracked_run``) that journals what it
    logs, so the run can move to the local store if its server fails; with tracking off
    (``run_id`` None) every method does nothing."""

    def __init__(self, run_id: str | None = None, uri: str | None = None, *,
                 run: JournaledRun | None = None) -> None:
        self._run, self._run_id, self._uri = run, run_id, uri

    @property
    def run_id(self) -> str | None:
        """The run's id in the store it is in now (a new id after a fallback)."""
        return self._run.run_id if self._run else self._run_id

    @property
    def uri(self) -> str | None:
        return self._run.uri if self._run else self._uri

    @property
    def active(self) -> bool:
        return self.run_id is not None

    def params(self, params: dict) -> None:
        if self._run:
            from mlflow.entities import Param

            batch = [Param(k, "" if v is None else str(v)) for k, v in params.items()]
            self._run.log("params", lambda c, rid: _log_batch(c, rid, params=batch))

    def metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._run:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            batch = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
            self._run.log("metrics", lambda c, rid: _log_batch(c, rid, metrics=batch))

    def tags(self, tags: dict[str, str]) -> None:
        if self._run:
            from mlflow.entities import RunTag

            batch = [RunTag(k, str(v)) for k, v in tags.items()]
            self._run.log("tags", lambda c, rid: _log_batch(c, rid, tags=batch))

    def text(self, text: str, name: str) -> None:
        if self._run:
            self._run.log("artifact", lambda c, rid: c.log_text(rid, text, name))

    def json(self, obj: dict | list, name: str) -> None:
        if self._run:
            self._run.log("artifact", lambda c, rid: c.log_dict(rid, obj, name))

    def table(self, columns: dict[str, list], name: str) -> None:
        """Per-worker or per-stage numbers as an MLflow table (``log_table``)."""
        if self._run and columns and any(columns.values()):
            self._run.log("artifact", lambda c, rid: c.log_table(rid, columns, name))

    def figure(self, fig, name: str) -> None:  # noqa: ANN001 - a matplotlib Figure
        if self._run:
            path = self._run.file(name)
            fig.savefig(path)  # rendered once: a replay uploads the same file
            self._run.log("artifact",
                          lambda c, rid: c.log_artifact(rid, str(path), artifact_dir(name)))
        import matplotlib.pyplot as plt

        plt.close(fig)  # pyplot keeps every figure alive until closed


def _log_batch(client, run_id: str, metrics=(), params=(), tags=()) -> None:  # noqa: ANN001
    """``log_batch`` within MLflow's limits (1000 metrics, 100 params or tags a call)."""
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
    for i in range(0, max(len(params), len(tags)), 100):
        client.log_batch(run_id, params=params[i:i + 100], tags=tags[i:i + 100])


@contextmanager
def tracked_run(experiment: str, run_name: str, tags: dict[str, str] | None = None,
                parent_run_id: str | None = None, system_metrics: bool = False,
                resume_run_id: str | None = None) -> Iterator[Tracker]:
    """Open an MLflow run; it ends FINISHED, KILLED on Ctrl-C, FAILED if the body raises
    (keeping what was logged). ``system_metrics``: sample CPU, memory (and GPU) while the
    run is open. ``resume_run_id``: reopen that run if it exists in the store (its metrics
    continue with their steps), else start a new one tagged ``pipebench.resumed_from``."""
    if not enabled():
        yield Tracker(None, None)
        return
    run = JournaledRun.start(default_tracking_uri(), experiment, run_name, tags,
                             parent_run_id,
                             SYSTEM_METRICS_INTERVAL_S if system_metrics else None,
                             resume_run_id)
    tracker = Tracker(run=run)
    try:
        yield tracker
    except BaseException as e:
        if not is_interrupt(e):
            _tag_error(tracker, e)
        run.end("KILLED" if is_interrupt(e) else "FAILED")
        raise
    run.end("FINISHED")


def _tag_error(tracker: Tracker, e: BaseException) -> None:
    """A FAILED run says why in its ``ERROR_TAG`` (the message's end, within MLflow's tag
    size); tagging that fails must not hide the error itself."""
    try:
        tracker.tags({ERROR_TAG: f"{type(e).__name__}: {e}"[-ERROR_CHARS:]})
    except Exception:  # noqa: BLE001 - the run's own error is what propagates
        pass


class DetachedRun:
    """A run driven by explicit run ids rather than one run at a time: a suite keeps its
    parent and one run per cell open while the cells' training runs come and go. Like a
    ``Tracker`` it journals what it logs. With tracking off every method does nothing and
    ``run_id`` is None."""

    def __init__(self, run: JournaledRun | None, experiment: str) -> None:
        self._run, self.experiment = run, experiment
        self.children: list[DetachedRun] = []
        self.ended = False

    @property
    def run_id(self) -> str | None:
        return self._run.run_id if self._run else None

    @property
    def uri(self) -> str | None:
        return self._run.uri if self._run else None

    def child(self, name: str, tags: dict[str, str]) -> DetachedRun:
        if self._run is None:
            return DetachedRun(None, self.experiment)
        run = JournaledRun.start(self._run.home, self.experiment, name, tags,
                                 parent_run_id=self._run.run_id)
        out = DetachedRun(run, self.experiment)
        self.children.append(out)
        return out

    def params(self, params: dict) -> None:
        if self._run:
            from mlflow.entities import Param

            batch = [Param(k, str(v)) for k, v in params.items()]
            self._run.log("params", lambda c, rid: _log_batch(c, rid, params=batch))

    def tags(self, tags: dict[str, str]) -> None:
        if self._run:
            from mlflow.entities import RunTag

            batch = [RunTag(k, str(v)) for k, v in tags.items()]
            self._run.log("tags", lambda c, rid: _log_batch(c, rid, tags=batch))

    def metrics(self, metrics: dict[str, float]) -> None:
        if self._run:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            batch = [Metric(k, float(v), now, 0) for k, v in metrics.items()]
            self._run.log("metrics", lambda c, rid: _log_batch(c, rid, metrics=batch))

    def json(self, obj: dict | list, name: str) -> None:
        if self._run:
            self._run.log("artifact", lambda c, rid: c.log_dict(rid, obj, name))

    def text(self, text: str, name: str) -> None:
        if self._run:
            self._run.log("artifact", lambda c, rid: c.log_text(rid, text, name))

    def end(self, status: str = "FINISHED") -> None:
        if self._run and not self.ended:
            self._run.end(status)
        self.ended = True

    def describe(self) -> dict | None:
        if self._run is None:
            return None
        return {"tracking_uri": self.uri, "experiment": self.experiment,
                "parent_run_id": self.run_id}


@contextmanager
def detached_run(experiment: str, run_name: str, tags: dict[str, str]) \
        -> Iterator[DetachedRun]:
    """A parent run for a suite; it and its unfinished children end FAILED if the body
    raises (KILLED on Ctrl-C), FINISHED otherwise."""
    if not enabled():
        yield DetachedRun(None, experiment)
        return
    parent = DetachedRun(JournaledRun.start(default_tracking_uri(), experiment, run_name,
                                            tags), experiment)
    try:
        yield parent
    except BaseException as e:
        status = "KILLED" if is_interrupt(e) else "FAILED"
        for c in parent.children:
            c.end(status)
        parent.end(status)
        raise
    for c in parent.children:
        c.end()
    parent.end()
