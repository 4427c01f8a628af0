"""Tracking that never loses a run: probe the server, journal what a run logs, and move
open runs to the local store when their server is unreachable or fails.

Why: with ``MLFLOW_TRACKING_URI`` at an ``mlflow server`` that is down, MLflow's client
retried every request for over four minutes and then raised, so a training run died
before it trained anything, or in the middle with its results lost. Here:

- before a run starts, an HTTP store's ``/health`` is probed (``PROBE_TIMEOUT_S``), and
  MLflow's own HTTP calls are bounded (``HTTP_LIMITS``, where the user set nothing else):
  a refused connection fails in about 2 s, a hung server in about 30 s;
- each open run keeps a ``journal``: every logging call (params, tags, metrics with their
  steps and timestamps, artifacts) as a function that redoes it on any store and run id;
- when a call to an HTTP store fails with an outage (``is_outage``: connection error,
  timeout, 5xx), the process falls back, once per server: every open run on that server
  gets a run in the local store (parents first, ``mlflow.parentRunId`` remapped) and its
  journal is replayed there; later runs of the process go straight to the local store.
  One line on stderr says so. Local runs carry ``INTENDED_TAG`` (the server they were
  meant for), which ``pipebench sync`` (``harness.reporting.sync``) uses to copy them there.

A failure of the local store itself, or a client error (4xx) from the server, is raised
as before. System metrics logged by MLflow's monitor before a switch stay on the server
(they are not journaled); the monitor restarts on the local run.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.paths import RESULTS

__all__ = ["FALLBACK_FROM_TAG", "HTTP_LIMITS", "INTENDED_TAG", "PARENT_TAG", "PROBE_TIMEOUT_S",
           "REASON_TAG", "RESUMED_FROM_TAG", "JournaledRun", "Store", "artifact_dir",
           "artifact_root", "bound_http_calls", "forget_fallbacks", "is_outage",
           "is_remote", "local_tracking_uri", "outage_reason", "probe"]

INTENDED_TAG = "pipebench.intended_tracking_uri"  # the server a local run was meant for
FALLBACK_FROM_TAG = "pipebench.fallback_from_run_id"  # its partial run on that server
REASON_TAG = "pipebench.fallback_reason"
RESUMED_FROM_TAG = "pipebench.resumed_from"
PARENT_TAG = "mlflow.parentRunId"
PROBE_TIMEOUT_S = 2.0
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5"}

Action = Callable[[Any, str], object]  # (MlflowClient, run id) -> ignored

_LOCK = threading.RLock()
_OPEN: list[JournaledRun] = []  # open runs, in the order they started (parents first)
_FALLEN: dict[str, str] = {}  # server URI -> why this process left it
_REMAP: dict[str, str] = {}  # run id on a server -> id of its local replacement


def local_tracking_uri() -> str:
    """The embedded store: ``PIPEBENCH_LOCAL_TRACKING_URI`` or ``results/mlflow.db``."""
    return os.environ.get("PIPEBENCH_LOCAL_TRACKING_URI") or f"sqlite:///{RESULTS / 'mlflow.db'}"


def artifact_root(uri: str) -> str | None:
    """Artifacts next to a local sqlite store; a server decides its own."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
    return None


def artifact_dir(name: str) -> str | None:
    """The artifact folder of a run-relative artifact file name (None: the root)."""
    return posixpath.dirname(name) or None


def is_remote(uri: str) -> bool:
    return uri.split(":", 1)[0].lower() in ("http", "https")


def bound_http_calls() -> None:
    """Bound MLflow's HTTP retries and timeouts (``HTTP_LIMITS``) unless already set."""
    for key, value in HTTP_LIMITS.items():
        os.environ.setdefault(key, value)


def forget_fallbacks() -> None:
    """Forget which servers this process left: its next runs probe them again (open runs
    stay where they are)."""
    with _LOCK:
        _FALLEN.clear()


def probe(uri: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the HTTP server at ``uri`` answers ``/health`` without a 5xx (or ``uri``
    is not HTTP); otherwise why not, e.g. ``connection refused after 0.0 s``."""
    if not is_remote(uri):
        return None
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except (OSError, ValueError) as e:  # refused, timed out, unknown host, malformed URL
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        return f"{_describe(reason)} after {time.monotonic() - t0:.1f} s"
    if status >= 500:
        return f"HTTP {status} from /health after {time.monotonic() - t0:.1f} s"
    return None  # 200, or 401/404 behind a proxy: let MLflow's own calls decide


def _describe(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return "no answer"
    text = str(reason)
    for needle, why in (("Connection refused", "connection refused"),
                        ("timed out", "timed out"), ("Read timed out", "timed out"),
                        ("Name or service not known", "unknown host"),
                        ("too many 5", "answering 5xx")):
        if needle in text:
            return why
    return (text.splitlines() or [type(reason).__name__])[0][:160]


def is_outage(e: BaseException) -> bool:
    """True for a server that is down or failing (connection error, timeout, 5xx after
    MLflow's retries), False for a client error (bad parameter, unknown run: 4xx)."""
    from mlflow.exceptions import MlflowException

    if isinstance(e, MlflowException):
        return e.get_http_status_code() >= 500
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(status, int):
        return status >= 500
    return isinstance(e, OSError)  # requests' connection errors and timeouts are OSErrors


def outage_reason(e: BaseException) -> str:
    return _describe(e)


class Store:
    """One tracking store as this process uses it: its URI, client and experiments."""

    def __init__(self, uri: str) -> None:
        from mlflow import MlflowClient

        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.uri, self.client, self.remote = uri, MlflowClient(uri), is_remote(uri)

    def experiment_id(self, name: str) -> str:
        """The experiment called ``name``, created (artifacts beside a sqlite store) if
        missing."""
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        return self.client.create_experiment(name, artifact_location=artifact_root(self.uri))

    def find_run(self, run_id: str):  # noqa: ANN201 - an mlflow Run or None
        """The run ``run_id`` if it exists here and is not deleted (outages raise)."""
        try:
            run = self.client.get_run(run_id)
        except Exception as e:  # noqa: BLE001 - mlflow raises several kinds for "not here"
            if is_outage(e):
                raise
            return None
        return None if run.info.lifecycle_stage == "deleted" else run


def _fall_back(uri: str, reason: str, during: str = "") -> Store:
    """Leave the server ``uri`` for the local store: move its open runs there (parents
    first), say so once, and return the local store."""
    with _LOCK:
        first = uri not in _FALLEN
        _FALLEN.setdefault(uri, reason)
        moved = [r for r in _OPEN if r.store.uri == uri]
        if first:  # said before the local store is opened (creating one takes seconds)
            what = f" during run {during!r}" if during else ""
            runs = f" ({len(moved)} open run(s) move there with what they logged)" \
                if moved else ""
            print(f"tracking server {uri} unreachable ({reason}){what}: logging to "
                  f"{local_tracking_uri()} instead{runs}; `pipebench sync --to {uri}` "
                  f"copies the runs there later", file=sys.stderr, flush=True)
        local = Store(local_tracking_uri())
        for run in moved:
            run.switch(local, reason)
    return local


def _open_store(uri: str) -> tuple[Store, str | None]:
    """The store a new run goes to and, when that is the local store standing in for a
    server, that server's URI."""
    bound_http_calls()
    if not is_remote(uri):
        return Store(uri), None
    if uri in _FALLEN:
        return Store(local_tracking_uri()), uri
    reason = probe(uri)
    if reason is None:
        return Store(uri), None
    return _fall_back(uri, reason), uri


class JournaledRun:
    """One open run, the store it is in, and the journal of what was logged to it."""

    def __init__(self, store: Store, experiment: str, run, tags: dict[str, str],  # noqa: ANN001
                 system_metrics_s: float | None, resumed: bool) -> None:
        self.store, self.experiment, self.run_id = store, experiment, run.info.run_id
        self.intended: str | None = tags.get(INTENDED_TAG)  # the server it stands in for
        self.name, self.start_time, self.tags = run.info.run_name, run.info.start_time, tags
        self.journal: list[tuple[str, Action]] = []
        self._files: str | None = None
        self._interval, self._monitor, self.resumed = system_metrics_s, None, resumed
        with _LOCK:
            _OPEN.append(self)
        if system_metrics_s:
            self._start_monitor(resumed)

    @classmethod
    def start(cls, uri: str, experiment: str, run_name: str, tags: dict[str, str] | None,
              parent_run_id: str | None = None, system_metrics_s: float | None = None,
              resume_run_id: str | None = None) -> JournaledRun:
        """Start (or, given ``resume_run_id`` of a run in the store, reopen) a run in
        ``uri``, or in the local store when that server is unreachable or fails."""
        store, intended = _open_store(uri)
        try:
            return cls._start_in(store, intended, experiment, run_name, tags, parent_run_id,
                                 system_metrics_s, resume_run_id)
        except Exception as e:
            if not store.remote or not is_outage(e):
                raise
            local = _fall_back(store.uri, outage_reason(e))
            return cls._start_in(local, store.uri, experiment, run_name, tags,
                                 parent_run_id, system_metrics_s, resume_run_id)

    @classmethod
    def _start_in(cls, store: Store, intended: str | None, experiment: str, run_name: str,
                  tags: dict[str, str] | None, parent_run_id: str | None,
                  system_metrics_s: float | None, resume_run_id: str | None) -> JournaledRun:
        from mlflow.entities import RunTag
        from mlflow.tracking.context import registry as context_registry

        tags = {k: str(v) for k, v in (tags or {}).items()}
        if intended:
            tags.update({INTENDED_TAG: intended, REASON_TAG: _FALLEN.get(intended, "")})
        exp_id = store.experiment_id(experiment)
        resume_id = _REMAP.get(resume_run_id, resume_run_id) if resume_run_id else None
        existing = store.find_run(resume_id) if resume_id else None
        if existing is not None:  # reopen it: metrics continue with their steps
            store.client.update_run(resume_id, status="RUNNING")
            if tags:
                store.client.log_batch(resume_id, tags=[RunTag(k, v) for k, v in tags.items()])
            return cls(store, experiment, existing, {**existing.data.tags, **tags},
                       system_metrics_s, resumed=True)
        if resume_run_id:
            tags[RESUMED_FROM_TAG] = resume_run_id
        if parent_run_id:
            tags[PARENT_TAG] = _REMAP.get(parent_run_id, parent_run_id)
        tags = context_registry.resolve_tags({**tags, "mlflow.runName": run_name})
        run = store.client.create_run(exp_id, tags=tags, run_name=run_name)
        return cls(store, experiment, run, tags, system_metrics_s, resumed=False)

    @property
    def uri(self) -> str:
        return self.store.uri

    @property
    def home(self) -> str:
        """The store this run was meant for (its children are started against it)."""
        return self.intended or self.store.uri

    def log(self, what: str, action: Action) -> None:
        """Journal ``action`` (``what``: params, tags, metrics, artifact) and do it."""
        self.journal.append((what, action))
        self._call(action, journaled=True)

    def file(self, name: str) -> Path:
        """A fresh local path for an artifact rendered here (kept until the run ends)."""
        if self._files is None:
            self._files = tempfile.mkdtemp(prefix="pipebench-journal-")
        path = Path(self._files) / str(len(self.journal)) / posixpath.basename(name)
        path.parent.mkdir(parents=True)
        return path

    def end(self, status: str) -> None:
        """Terminate the run with ``status`` (FINISHED, FAILED, KILLED), wherever it is."""
        if self._monitor is not None:
            self._monitor.finish()  # bounded: one get_run and one flush
            self._monitor = None
        try:
            self._call(lambda c, rid: c.set_terminated(rid, status), journaled=False)
        finally:
            with _LOCK:
                if self in _OPEN:
                    _OPEN.remove(self)
            if self._files:
                shutil.rmtree(self._files, ignore_errors=True)

    def switch(self, local: Store, reason: str) -> None:
        """Continue in ``local``: a new run with the same name, start time and tags (the
        parent remapped), the journal replayed into it."""
        old_id, tags = self.run_id, dict(self.tags)
        if PARENT_TAG in tags:
            tags[PARENT_TAG] = _REMAP.get(tags[PARENT_TAG], tags[PARENT_TAG])
        # a reopened run keeps its earlier epochs on the server: this one continues it
        tags.update({INTENDED_TAG: self.store.uri, REASON_TAG: reason,
                     RESUMED_FROM_TAG if self.resumed else FALLBACK_FROM_TAG: old_id})
        run = local.client.create_run(local.experiment_id(self.experiment),
                                      start_time=self.start_time, tags=tags, run_name=self.name)
        _REMAP[old_id] = run.info.run_id
        self.intended = self.store.uri
        self.store, self.run_id, self.tags = local, run.info.run_id, tags
        for _, action in self.journal:
            action(local.client, self.run_id)
        if self._monitor is not None:  # the old one stops on its own failure
            threading.Thread(target=self._monitor.finish, daemon=True).start()
            self._start_monitor(resumed=False)

    def _call(self, action: Action, journaled: bool) -> None:
        store = self.store
        try:
            action(store.client, self.run_id)
            return
        except Exception as e:
            if not store.remote or not is_outage(e):
                raise
            _fall_back(store.uri, outage_reason(e), during=self.name)
        if not journaled or self.store is store:  # a journaled action was replayed
            action(self.store.client, self.run_id)

    def _start_monitor(self, resumed: bool) -> None:
        import logging

        # its INFO lines ("Started monitoring system metrics", ...) for every run are noise
        # between our progress lines, and printed even under --quiet
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(
                self.run_id, sampling_interval=self._interval, samples_before_logging=1,
                resume_logging=resumed, tracking_uri=self.store.uri)
            self._monitor.start()
        except Exception as e:  # noqa: BLE001 - as mlflow.start_run: the run goes on
            self._monitor = None
            print(f"system metrics are not recorded for run {self.name!r}: {e}",
                  file=sys.stderr)
