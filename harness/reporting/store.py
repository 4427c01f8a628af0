"""Reading the MLflow store back: suite results by run, a suite's history on a machine,
and training runs as a comparison table.

Why: ``regressions --history``, ``compare`` and ``dashboard`` look at what earlier runs
logged instead of running anything; the tags they search by are written by
``harness.experiments.suite_run`` (``pipebench.kind``, ``pipebench.suite``,
``pipebench.machine``) and the columns they read are the run metrics of ``harness.metrics``.
A suite's history can also be a directory of result files (``file_history``): what a CI
runner without a lasting store keeps of its nights. Both follow one rule (``_before``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from core.errors import UserInputError
from harness import metrics
from harness.reporting import tracking
from harness.reporting.results import load_result, parse_result
from harness.reporting.units import fmt_bytes

__all__ = ["COMPARE_COLUMNS", "compare_records", "compare_rows", "dir_history", "file_history",
           "load_result_or_run", "search_runs", "store_history", "suite_history",
           "suite_runs"]

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
COMPARE_COLUMNS = ("run", "system", "workload", "scale", "workers", "config", "samples/s",
                   "time to target (s)", "epochs", "best quality", "bytes/sample",
                   "peak mem", "bubble", "start")


def _mlflow():  # noqa: ANN202
    import mlflow

    tracking.mlflow_output_defaults()
    mlflow.set_tracking_uri(tracking.default_tracking_uri())
    return mlflow


def _suite_json(run_id: str) -> dict:
    mlflow = _mlflow()
    try:
        path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="suite.json")
    except Exception as e:  # noqa: BLE001 - mlflow raises several kinds for a missing run
        raise UserInputError(f"run {run_id}: no suite.json in "
                             f"{tracking.default_tracking_uri()} ({type(e).__name__})") from None
    return parse_result(Path(path).read_bytes(), f"run {run_id}: suite.json")


def load_result_or_run(ref: str) -> dict:
    """A suite result from a file, or from the MLflow run (32 hex digits) that logged it."""
    if Path(ref).exists() or not _RUN_ID.match(ref):
        return load_result(ref)
    return _suite_json(ref)


def suite_runs(experiment: str, suite: str | None = None, machine: str | None = None,
               limit: int = 100) -> list:
    """Finished suite parent runs, newest first (mlflow Run objects)."""
    mlflow = _mlflow()
    if mlflow.get_experiment_by_name(experiment) is None:
        return []
    filt = ["tags.`pipebench.kind` = 'suite'", "attributes.status = 'FINISHED'"]

    def quoted(v: str) -> str:
        if "'" in v or "\\" in v:
            raise UserInputError(f"a suite or machine name with quotes cannot be searched "
                                 f"for in MLflow: {v!r}")
        return f"'{v}'"

    if suite:
        filt.append(f"tags.`pipebench.suite` = {quoted(suite)}")
    if machine:
        filt.append(f"tags.`pipebench.machine` = {quoted(machine)}")
    return mlflow.search_runs(experiment_names=[experiment], filter_string=" and ".join(filt),
                              order_by=["attributes.start_time DESC"], max_results=limit,
                              output_format="list")


def _planted(result: dict) -> bool:
    """A planted slowdown (``suite.plant``): a detector's test run, never a night."""
    return bool(result["suite"].get("plant"))


def _identity(result: dict) -> tuple:
    """What makes two suite result files one result: suite, machine, time and commit."""
    return (result["suite"]["name"], result["environment"]["machine"], result["created"],
            result["environment"].get("git_sha"))


def _before(current: dict, result: dict) -> bool:
    """Whether ``result`` belongs to ``current``'s history: the same suite on the same
    machine, made (``created``: when its suite run finished) no later, and not planted.
    ``current`` itself is left out by the caller."""
    return (result["suite"]["name"] == current["suite"]["name"]
            and result["environment"]["machine"] == current["environment"]["machine"]
            and result["created"] <= current["created"]
            and not _planted(result))


def suite_history(current: dict, n: int, experiment: str | None = None) -> list[dict]:
    """The last ``n`` results of ``current``'s suite on its machine, oldest first, leaving
    out ``current`` itself and anything that started after it."""
    exp = experiment or (current.get("mlflow") or {}).get("experiment") or "pipebench-suite"
    own = (current.get("mlflow") or {}).get("parent_run_id")
    found = []
    for run in suite_runs(exp, current["suite"]["name"], current["environment"]["machine"]):
        if run.info.run_id == own:
            continue
        result = _suite_json(run.info.run_id)
        if _before(current, result):
            found.append(result)
        if len(found) == n:
            break
    return found[::-1]


def store_history(experiment: str, suite: str | None, n: int) -> list[dict]:
    """``dir_history`` from the store: the results of the last ``n`` runs started of
    ``suite`` (else of the suite last run, planted or not) on the machine that ran it last,
    planted runs skipped (the dashboard's nights), shown oldest first by ``created``: the
    newest of them is the one compared, every other one made no later (``_before``)."""
    newest = suite_runs(experiment, suite, limit=1)
    if not newest or n < 1:
        return []
    tags = newest[0].data.tags
    found = []
    for run in suite_runs(experiment, tags["pipebench.suite"], tags.get("pipebench.machine"),
                          limit=max(100, 2 * n)):  # room for planted runs among them
        result = _suite_json(run.info.run_id)
        if not _planted(result):
            found.append(result)
        if len(found) == n:
            break
    return sorted(found, key=lambda r: r["created"])


def _results_in(directory: str) -> list[dict]:
    """Every suite result file (``*.json``) in ``directory``, oldest first (by ``created``),
    each result once (copies: the same suite, machine, time and commit); a file that is
    not one, or lacks its suite name, machine or time, is an error, not passed over in
    silence."""
    found: dict[tuple, dict] = {}
    for p in sorted(Path(directory).glob("*.json")):
        r = load_result(p)
        if not isinstance(r.get("suite"), dict) or "name" not in r["suite"] or \
                "machine" not in (r.get("environment") or {}) or \
                not isinstance(r.get("created"), str):
            raise UserInputError(f"{p}: a suite result without its suite name, machine "
                                 "or time")
        found.setdefault(_identity(r), r)
    return sorted(found.values(), key=lambda r: r["created"])


def file_history(current: dict, n: int, directory: str,
                 results: list[dict] | None = None) -> list[dict]:
    """``suite_history`` from the suite result files in ``directory`` (or ``results``,
    already read from it) instead of the store: the last ``n`` by ``created``, oldest
    first. A file equal to ``current`` (the same time and commit: tonight's result kept
    beside its history) is left out; results of other suites or machines, and planted
    ones, are passed over."""
    found = [r for r in (_results_in(directory) if results is None else results)
             if _before(current, r) and _identity(r) != _identity(current)]
    return found[-n:] if n else []


def dir_history(directory: str, suite: str | None, n: int) -> list[dict]:
    """The newest result in ``directory`` (of ``suite`` if given) and up to ``n - 1`` of
    its history there, oldest first (the dashboard's nights); empty if none."""
    results = _results_in(directory)
    mine = [r for r in results if suite in (None, r["suite"]["name"]) and not _planted(r)]
    if not mine:
        return []
    return [*file_history(mine[-1], n - 1, directory, results), mine[-1]]


def search_runs(experiment: str, filter_string: str = ""):  # noqa: ANN201 - a DataFrame
    """Training runs (not suite or cell runs) of ``experiment``, newest first."""
    mlflow = _mlflow()
    if mlflow.get_experiment_by_name(experiment) is None:
        raise UserInputError(f"no MLflow experiment {experiment!r} in "
                             f"{tracking.default_tracking_uri()}")
    base = "params.system != ''"
    filt = f"{base} and {filter_string}" if filter_string else base
    try:
        return mlflow.search_runs(experiment_names=[experiment], filter_string=filt,
                                  order_by=["attributes.start_time DESC"])
    except mlflow.exceptions.MlflowException as e:
        raise UserInputError(f"--filter {filter_string!r}: {e.message}") from None


def _num(row, col: str) -> float | None:  # noqa: ANN001
    try:
        v = float(row.get(col))
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _param(row, name: str) -> str | None:  # noqa: ANN001 - pandas gives NaN when unset
    v = row.get(f"params.{name}")
    return v if isinstance(v, str) else None


def compare_records(frame) -> list[dict]:  # noqa: ANN001 - the DataFrame of search_runs
    """One record per run with the numbers as logged (``None`` where not logged)."""
    out = []
    bubble_cols = [c for c in frame.columns if c.startswith("metrics.") and
                   metrics.get(metrics.BUBBLE_FRACTION).match(c[len("metrics."):])]
    for _, r in frame.iterrows():
        bubbles = {c: b for c in bubble_cols if (b := _num(r, c)) is not None}
        rec = {"run_id": r["run_id"], "start_time": str(r["start_time"])[:19]}
        rec.update({k: _param(r, k) for k in ("system", "workload", "scale", "workers")})
        rec["config"] = _param(r, "config") or "1"
        rec.update({k: _num(r, f"metrics.{k}") for k in (
            metrics.THROUGHPUT, metrics.TIME_TO_TARGET, metrics.EPOCHS_RUN,
            metrics.BEST_QUALITY, metrics.BYTES_PER_SAMPLE, metrics.PEAK_MEMORY_MAX)})
        rec[metrics.BUBBLE_FRACTION] = metrics.mean_bubble(
            {k[len("metrics."):]: v for k, v in bubbles.items()})
        out.append(rec)
    return out


def compare_rows(records: list[dict]) -> list[tuple]:
    """``compare_records`` formatted for people, in the columns ``COMPARE_COLUMNS``."""
    def f(v, fmt: str) -> str:  # noqa: ANN001
        return "" if v is None else format(v, fmt)

    return [(r["run_id"][:8], r["system"], r["workload"], r["scale"], r["workers"], r["config"],
             f(r[metrics.THROUGHPUT], ".0f"),
             "not reached" if (ttt := r[metrics.TIME_TO_TARGET]) is None else f"{ttt:.1f}",
             f(r[metrics.EPOCHS_RUN], ".0f"), f(r[metrics.BEST_QUALITY], ".4g"),
             "" if (b := r[metrics.BYTES_PER_SAMPLE]) is None else fmt_bytes(b),
             "" if (mem := r[metrics.PEAK_MEMORY_MAX]) is None else fmt_bytes(mem),
             "-" if (bub := r[metrics.BUBBLE_FRACTION]) is None else f"{100 * bub:.0f}%",
             r["start_time"]) for r in records]
