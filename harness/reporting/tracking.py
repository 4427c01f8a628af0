"""MLflow tracking: where runs go and the one schema every system logs.

Default store: ``sqlite:///<repo>/results/mlflow.db`` with artifacts in
``results/mlartifacts`` (no server). ``MLFLOW_TRACKING_URI`` overrides it, e.g. a real
``mlflow server``. Only the launcher process logs (SQLite takes one writer at a time).

The schema (documented in results/README.md; tests check it): keys in ``PARAM_KEYS`` are
params of every run, ``EPOCH_METRICS`` are logged each epoch with ``step=epoch``, and
``RUN_METRICS`` once at the end (``time_to_target_s`` only when the target was reached).

``PIPEBENCH_TRACKING=off`` turns tracking off: ``tracked_run`` then yields a tracker that
logs nothing and never imports mlflow (the harness-overhead measurement and machines
without mlflow use it). Training runs also record MLflow's system metrics (CPU, memory,
GPU when ``nvidia-ml-py`` sees one) every ``SYSTEM_METRICS_INTERVAL_S`` seconds.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from harness.paths import REPO

__all__ = ["EPOCH_METRICS", "PARAM_KEYS", "RUN_METRICS", "SYSTEM_METRICS_INTERVAL_S",
           "TARGET_METRICS", "DetachedRun", "Tracker", "artifact_root", "default_tracking_uri",
           "detached_run", "enabled", "git_sha", "hardware", "peak_memory_key", "tracked_run"]

PARAM_KEYS = ("system", "workload", "scale", "batch_size", "global_batch_size", "workers",
              "seed", "epochs", "target", "metric", "data", "optimizer", "lr", "threads",
              "device", "hardware", "git_sha", "torch_version", "num_parameters", "warmup_steps")
EPOCH_METRICS = ("epoch_time_s", "samples_per_s", "train_loss", "quality", "eval_time_s")
RUN_METRICS = ("throughput_samples_per_s", "final_quality", "best_quality", "total_time_s",
               "epochs_run", "bytes_communicated_per_sample", "peak_memory_bytes_max")
TARGET_METRICS = ("time_to_target_s", "epochs_to_target")
SYSTEM_METRICS_INTERVAL_S = 2.0


def enabled() -> bool:
    """False when ``PIPEBENCH_TRACKING`` is off (``off``, ``0``, ``false``, ``no``)."""
    return os.environ.get("PIPEBENCH_TRACKING", "on").strip().lower() not in (
        "off", "0", "false", "no")


def peak_memory_key(rank: int) -> str:
    return f"peak_memory_bytes_worker_{rank}"


def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO / 'results' / 'mlflow.db'}"


def artifact_root(uri: str) -> str | None:
    """Artifacts next to a local sqlite store; a server decides its own."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    return None


def git_sha() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
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
    """A thin wrapper over one active MLflow run (created by ``tracked_run``); with
    tracking off (``run_id`` None) every method does nothing."""

    def __init__(self, run_id: str | None, uri: str | None) -> None:
        self.run_id, self.uri = run_id, uri

    @property
    def active(self) -> bool:
        return self.run_id is not None

    def params(self, params: dict) -> None:
        if self.active:
            import mlflow

            mlflow.log_params({k: ("" if v is None else str(v)) for k, v in params.items()})

    def metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.active:
            import mlflow

            mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def tags(self, tags: dict[str, str]) -> None:
        if self.active:
            import mlflow

            mlflow.set_tags(tags)

    def text(self, text: str, name: str) -> None:
        if self.active:
            import mlflow

            mlflow.log_text(text, name)

    def json(self, obj: dict | list, name: str) -> None:
        if self.active:
            import mlflow

            mlflow.log_dict(obj, name)

    def table(self, columns: dict[str, list], name: str) -> None:
        """Per-worker or per-stage numbers as an MLflow table (``mlflow.log_table``)."""
        if self.active and columns and any(columns.values()):
            import mlflow

            mlflow.log_table(data=columns, artifact_file=name)

    def figure(self, fig, name: str) -> None:  # noqa: ANN001 - a matplotlib Figure
        if self.active:
            import mlflow

            mlflow.log_figure(fig, name)
        import matplotlib.pyplot as plt

        plt.close(fig)  # pyplot keeps every figure alive until closed


@contextmanager
def tracked_run(experiment: str, run_name: str, tags: dict[str, str] | None = None,
                parent_run_id: str | None = None,
                system_metrics: bool = False) -> Iterator[Tracker]:
    """Start an MLflow run; mark it FAILED (keeping what was logged) if the body raises.
    ``system_metrics``: sample CPU, memory (and GPU) while the run is open."""
    if not enabled():
        yield Tracker(None, None)
        return
    import mlflow

    uri, exp_id = _experiment_id(experiment)
    mlflow.set_experiment(experiment_id=exp_id)
    if system_metrics:
        mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_INTERVAL_S)
        mlflow.set_system_metrics_samples_before_logging(1)
    run = mlflow.start_run(run_name=run_name, tags=tags, nested=parent_run_id is not None,
                           parent_run_id=parent_run_id, log_system_metrics=system_metrics)
    try:
        yield Tracker(run.info.run_id, uri)
    except BaseException:
        mlflow.end_run(status="FAILED")
        raise
    mlflow.end_run(status="FINISHED")


class DetachedRun:
    """A run driven through ``MlflowClient`` rather than the fluent API's one active run:
    a suite keeps its parent and one run per cell open while the cells' training runs
    come and go. With tracking off every method does nothing and ``run_id`` is None."""

    def __init__(self, client, experiment_id: str | None, run_id: str | None,  # noqa: ANN001
                 uri: str | None, experiment: str) -> None:
        self.client, self.experiment_id, self.run_id = client, experiment_id, run_id
        self.uri, self.experiment = uri, experiment
        self.children: list[DetachedRun] = []
        self.ended = False

    def child(self, name: str, tags: dict[str, str]) -> DetachedRun:
        if self.run_id is None:
            return DetachedRun(None, None, None, None, self.experiment)
        run = self.client.create_run(self.experiment_id, run_name=name,
                                     tags={**tags, "mlflow.parentRunId": self.run_id})
        out = DetachedRun(self.client, self.experiment_id, run.info.run_id, self.uri,
                          self.experiment)
        self.children.append(out)
        return out

    def params(self, params: dict) -> None:
        if self.run_id:
            from mlflow.entities import Param

            self.client.log_batch(self.run_id, params=[Param(k, str(v))
                                                       for k, v in params.items()])

    def tags(self, tags: dict[str, str]) -> None:
        if self.run_id:
            from mlflow.entities import RunTag

            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def metrics(self, metrics: dict[str, float]) -> None:
        if self.run_id:
            import time

            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, 0)
                                                        for k, v in metrics.items()])

    def json(self, obj: dict | list, name: str) -> None:
        if self.run_id:
            self.client.log_dict(self.run_id, obj, name)

    def end(self, status: str = "FINISHED") -> None:
        if self.run_id and not self.ended:
            self.client.set_terminated(self.run_id, status)
        self.ended = True

    def describe(self) -> dict | None:
        if self.run_id is None:
            return None
        return {"tracking_uri": self.uri, "experiment": self.experiment,
                "parent_run_id": self.run_id}


def _experiment_id(experiment: str) -> tuple[str, str]:
    """Point mlflow at the store and return (uri, experiment id), creating both once."""
    import mlflow

    uri = default_tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return uri, mlflow.create_experiment(experiment, artifact_location=artifact_root(uri))
    return uri, exp.experiment_id


@contextmanager
def detached_run(experiment: str, run_name: str, tags: dict[str, str]) \
        -> Iterator[DetachedRun]:
    """A parent run for a suite; it and its unfinished children end FAILED if the body
    raises (KILLED on Ctrl-C), FINISHED otherwise."""
    if not enabled():
        yield DetachedRun(None, None, None, None, experiment)
        return
    from mlflow import MlflowClient

    uri, exp_id = _experiment_id(experiment)
    client = MlflowClient(uri)
    run = client.create_run(exp_id, run_name=run_name, tags=tags)
    parent = DetachedRun(client, exp_id, run.info.run_id, uri, experiment)
    try:
        yield parent
    except BaseException as e:
        status = "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"
        for c in parent.children:
            c.end(status)
        parent.end(status)
        raise
    for c in parent.children:
        c.end()
    parent.end()
