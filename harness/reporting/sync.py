"""``pipebench sync``: copy runs from the local store to a tracking server.

Why: a run whose server was down or died continues in the local store
(``harness.reporting.fallback``), tagged with the server it was meant for. Once that server
is back, this copies such runs there as they are: experiment (created by name if missing),
run name, params, tags, every metric's full history (step, timestamp, value), artifacts,
status, start and end times, and parent links (``mlflow.parentRunId`` remapped to the new
ids; parents are copied before their children).

It is idempotent: a copied run is tagged in the local store with the id it got on the
target (``SYNCED_RUN_TAG``, ``SYNCED_TO_TAG``) and skipped next time; a copy left half-done
by an interrupted sync (found by ``SYNCED_FROM_TAG`` on the target) is deleted and redone.
Runs still RUNNING are left for a later sync. The partial run a fallback left on the
server (``FALLBACK_FROM_TAG``), if still RUNNING there, is ended KILLED and tagged
``SUPERSEDED_TAG`` with its full copy's id.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UserInputError
from harness.reporting import tracking
from harness.reporting.fallback import (
    FALLBACK_FROM_TAG,
    INTENDED_TAG,
    PARENT_TAG,
    artifact_root,
    bound_http_calls,
    is_outage,
    is_remote,
    local_tracking_uri,
    outage_reason,
    probe,
)
from harness.reporting.progress import Progress

__all__ = ["SUPERSEDED_TAG", "SYNCED_FROM_TAG", "SYNCED_RUN_TAG", "SYNCED_TO_TAG",
           "SyncReport", "SyncedRun", "sync_runs"]

SYNCED_RUN_TAG = "pipebench.synced_run_id"  # on the local run: its id on the target
SYNCED_TO_TAG = "pipebench.synced_to"  # on the local run: the target's URI
SYNCED_FROM_TAG = "pipebench.synced_from_run_id"  # on the copy: the local run's id
SUPERSEDED_TAG = "pipebench.superseded_by"  # on a partial run left by a fallback
_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql")


@dataclass(frozen=True)
class SyncedRun:
    local_id: str
    target_id: str
    experiment: str
    name: str
    status: str
    params: int
    metrics: int
    points: int
    artifacts: int


@dataclass
class SyncReport:
    target: str
    source: str
    copied: list[SyncedRun] = field(default_factory=list)
    already: int = 0  # synced to this target before
    running: list[str] = field(default_factory=list)  # left for a later sync

    def summary(self) -> str:
        left = f"; {len(self.running)} still RUNNING left for a later sync" \
            if self.running else ""
        return (f"synced {len(self.copied)} run(s) from {self.source} to {self.target} "
                f"({self.already} already there{left})")


def _check_uri(uri: str, flag: str) -> str:
    uri = uri.strip().rstrip("/")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme not in _SCHEMES or "://" not in uri:
        raise UserInputError(f"{flag} {uri!r} is not a tracking URI: give the address of an "
                             f"`mlflow server`, e.g. http://HOST:5000 (or sqlite:///PATH)")
    if scheme == "sqlite" and not uri.startswith("sqlite:///"):
        raise UserInputError(f"{flag} {uri!r}: a sqlite store is sqlite:///ABSOLUTE/PATH")
    return uri


def _check_reachable(uri: str, flag: str) -> None:
    reason = probe(uri)
    if reason:
        raise UserInputError(f"tracking server {uri} unreachable ({reason}): start it "
                             f"(`mlflow server ...`) or fix {flag}")
    if uri.startswith("sqlite:///") and flag == "--from" \
            and not Path(uri[len("sqlite:///"):]).exists():
        raise UserInputError(f"--from {uri}: no such store (the file does not exist)")


def sync_runs(to: str, source: str | None = None, experiment: str | None = None,
              all_runs: bool = False, progress: Progress | None = None) -> SyncReport:
    """Copy the runs of ``source`` (default: the local store) that fell back from ``to``
    (every run with ``all_runs``), in ``experiment`` or all experiments, to ``to``."""
    from mlflow import MlflowClient

    bound_http_calls()
    tracking.mlflow_output_defaults()
    progress = progress or Progress()
    to, source = _check_uri(to, "--to"), _check_uri(source or local_tracking_uri(), "--from")
    if to == source:
        raise UserInputError(f"--to and --from are the same store ({to}): nothing to copy")
    _check_reachable(source, "--from")
    _check_reachable(to, "--to")
    src, dst = MlflowClient(source), MlflowClient(to)
    report = SyncReport(to, source)
    try:
        runs, names = _select(src, to, experiment, all_runs, report)
        id_map: dict[str, str] = {}
        for run in _parents_first(runs):
            copied = _copy(src, dst, run, names[run.info.experiment_id], to, id_map)
            report.copied.append(copied)
            progress.note(f"{copied.experiment}/{copied.name} ({copied.local_id[:8]}) -> "
                          f"{copied.target_id}: {copied.status}, {copied.params} params, "
                          f"{copied.metrics} metrics ({copied.points} points), "
                          f"{copied.artifacts} artifact file(s)")
    except Exception as e:
        if not is_outage(e) or isinstance(e, UserInputError):
            raise
        done = len(report.copied)
        raise UserInputError(f"sync to {to} failed after {done} run(s) ({outage_reason(e)}): "
                             f"run it again; runs already copied are skipped") from None
    return report


def _select(src, to: str, experiment: str | None, all_runs: bool,  # noqa: ANN001
            report: SyncReport) -> tuple[list, dict[str, str]]:
    """The runs to copy and the names of their experiments (by id)."""
    if experiment:
        exp = src.get_experiment_by_name(experiment)
        if exp is None:
            raise UserInputError(f"--experiment {experiment!r}: no such experiment in "
                                 f"{report.source}")
        exps = [exp]
    else:
        exps = _paged(lambda token: src.search_experiments(max_results=1000, page_token=token))
    names = {e.experiment_id: e.name for e in exps}
    runs = []
    for run in _paged(lambda token: src.search_runs(list(names), max_results=1000,
                                                    page_token=token)) if names else []:
        tags = run.data.tags
        if not all_runs and tags.get(INTENDED_TAG, "").rstrip("/") != to:
            continue
        if tags.get(SYNCED_RUN_TAG) and tags.get(SYNCED_TO_TAG) == to:
            report.already += 1
        elif run.info.status == "RUNNING":
            report.running.append(run.info.run_id)
        else:
            runs.append(run)
    return runs, names


def _paged(search) -> list:  # noqa: ANN001 - a search taking a page token
    out, token = [], None
    while True:
        page = search(token)
        out += list(page)
        token = page.token
        if not token:
            return out


def _parents_first(runs: list) -> list:
    by_id = {r.info.run_id: r for r in sorted(runs, key=lambda r: r.info.start_time or 0)}
    out, seen = [], set()

    def visit(run) -> None:  # noqa: ANN001
        if run.info.run_id in seen:
            return
        seen.add(run.info.run_id)
        parent = by_id.get(run.data.tags.get(PARENT_TAG, ""))
        if parent is not None:
            visit(parent)
        out.append(run)

    for run in by_id.values():
        visit(run)
    return out


def _target_parent(src, parent: str, to: str, id_map: dict[str, str]) -> str:  # noqa: ANN001
    """``parent``'s id on the target: copied now, copied by an earlier sync, or as is."""
    if parent in id_map:
        return id_map[parent]
    try:
        tags = src.get_run(parent).data.tags
    except Exception:  # noqa: BLE001 - not in the source: an id of the target's own
        return parent
    return tags[SYNCED_RUN_TAG] if tags.get(SYNCED_TO_TAG) == to and SYNCED_RUN_TAG in tags \
        else parent


def _copy(src, dst, run, experiment: str, to: str,  # noqa: ANN001
          id_map: dict[str, str]) -> SyncedRun:
    from mlflow.entities import Metric, Param, ViewType

    rid = run.info.run_id
    exp = dst.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else dst.create_experiment(
        experiment, artifact_location=None if is_remote(to) else artifact_root(to))
    for stale in dst.search_runs([exp_id], f"tags.`{SYNCED_FROM_TAG}` = '{rid}'",
                                 run_view_type=ViewType.ACTIVE_ONLY):
        dst.delete_run(stale.info.run_id)  # a copy an interrupted sync left half-done
    tags = {k: v for k, v in run.data.tags.items() if k not in (SYNCED_RUN_TAG, SYNCED_TO_TAG)}
    if PARENT_TAG in tags:
        tags[PARENT_TAG] = _target_parent(src, tags[PARENT_TAG], to, id_map)
    tags[SYNCED_FROM_TAG] = rid
    new_id = dst.create_run(exp_id, start_time=run.info.start_time, tags=tags,
                            run_name=run.info.run_name).info.run_id
    params = [Param(k, v) for k, v in run.data.params.items()]
    for i in range(0, len(params), 100):
        dst.log_batch(new_id, params=params[i:i + 100])
    points = 0
    for key in run.data.metrics:
        history = [Metric(m.key, m.value, m.timestamp, m.step)
                   for m in src.get_metric_history(rid, key)]
        points += len(history)
        for i in range(0, len(history), 1000):
            dst.log_batch(new_id, metrics=history[i:i + 1000])
    files = 0
    if src.list_artifacts(rid):
        with tempfile.TemporaryDirectory(prefix="pipebench-sync-") as tmp:
            local = src.download_artifacts(rid, "", tmp)
            files = sum(1 for p in Path(local).rglob("*") if p.is_file())
            dst.log_artifacts(new_id, local)
    dst.set_terminated(new_id, run.info.status, end_time=run.info.end_time)
    _supersede(dst, tags.get(FALLBACK_FROM_TAG), new_id, tags.get(INTENDED_TAG, "") == to)
    src.set_tag(rid, SYNCED_RUN_TAG, new_id)  # last: the run counts as copied from here on
    src.set_tag(rid, SYNCED_TO_TAG, to)
    id_map[rid] = new_id
    return SyncedRun(rid, new_id, experiment, run.info.run_name, run.info.status,
                     len(params), len(run.data.metrics), points, files)


def _supersede(dst, partial: str | None, new_id: str, same_server: bool) -> None:  # noqa: ANN001
    """End the partial run a fallback left on this server, pointing at its full copy."""
    if not partial or not same_server:
        return
    try:
        run = dst.get_run(partial)
    except Exception:  # noqa: BLE001 - gone (deleted, or another backend): nothing to do
        return
    dst.set_tag(partial, SUPERSEDED_TAG, new_id)
    if run.info.status == "RUNNING":
        dst.set_terminated(partial, "KILLED")
