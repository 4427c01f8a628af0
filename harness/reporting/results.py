"""The suite result: its versioned JSON schema and the one rule that turns repeats into a
number with a spread.

Why: the nightly benchmark, ``regressions`` and the dashboard all read the same document,
so its shape and the statistics rule have one home.

The rule (written down as the issue asks; MLPerf Training runs a benchmark several times
and drops the fastest and slowest before aggregating; TorchBench marks a benchmark
unstable when repeated runs disagree beyond a threshold):
- every cell runs ``repeats`` times, systems interleaved across repeats;
- with 5 or more repeats the lowest and highest value are dropped (MLPerf); the centre
  is the median of what is kept, the spread its min and max;
- a cell is ``stable`` when (max - min) / median <= ``STABILITY`` (TorchBench-style), a
  flag for readers; regressions judge with ``harness.reporting.verdicts`` instead;
- beside them, the confidence interval of the repeats' geometric mean
  (``verdicts.interval``: ``ci_low``, ``ci_high``; null under two repeats).

Schema ``pipebench-suite/1`` (``SCHEMA``)::

    {"schema": "pipebench-suite/1", "created": ISO time,
     "suite": {"name", "description", "source", "repeats", "threads", "device", "plant"},
     "environment": {"git_sha", "python", "torch", "torchvision", "horovod", "deepspeed",
                     "mlflow", "hardware", "machine", "cpu_count", "threads_per_worker",
                     "device", "platform", "runtime_env"},
     "rule": {"centre", "spread", "drop_extremes_from", "stability"},
     "definitions": {NAME: version} (``DEFINITIONS``; absent in results made before),
     "mlflow": {"tracking_uri", "experiment", "parent_run_id"} or null,
     "cells": [{"key", "workload", "scale", "workers", "system", "mode", "tracking",
                "status": "ok" | "failed" | "unsupported", "note", "config", "batch",
                "microbatch", "metric", "target",
                "metrics": {NAME: {"median", "min", "max", "ci_low", "ci_high",
                                   "rel_spread", "n", "values", "stable"}},
                "counters": {NAME: number}, "counters_consistent": bool,
                "curve": {"seconds": [...], "quality": [...]} (last repeat),
                "timeline": {"labels": {rank: str}, "spans": {rank: [[start ms, dur ms,
                             kind, busy], ...]}} (last repeat, last epoch) or null,
                "per_worker": {"peak_memory_bytes": {rank: n}, "bubble_fraction":
                               {rank: x}} (last repeat),
                "actions": {rank: {kind: {figure: x}}} (median over repeats, per
                           minibatch: ``harness.reporting.action_costs``; empty for
                           engines that log no thread use),
                "reached": repeats that reached the target, "run_ids": [...]}],
     (a cell with no successful repeat has only its key fields, status, note, empty
     metrics and counters and no curve, timeline or per_worker)
     "overhead": [{"cell", "tracked", "untracked", "overhead"}]}

``METRICS`` are noisy (judged by ``verdicts.test``), ``COUNTERS`` must not move at all; the
metrics' names and meanings are ``harness.metrics``'s (``SUITE_METRICS``). A figure whose
definition changed after the schema began carries a version in ``DEFINITIONS``, which each
result records; figures measured under different versions are never compared
(``comparable``): a changed definition is not a regression.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserInputError
from harness import metrics
from harness.reporting import verdicts
from harness.reporting.units import fmt_bytes

__all__ = ["COUNTERS", "DEFINITIONS", "DROP_EXTREMES_FROM", "METRICS", "RULE", "SCHEMA",
           "STABILITY", "Stat", "cell_row", "comparable", "definition", "load_result",
           "ok_cells", "overhead_rows", "overhead_table", "parse_result", "redefined",
           "round_speeds", "summarise", "with_drift_cancelled", "write_result"]

SCHEMA = "pipebench-suite/1"
# each figure's definition where it changed after the schema began (else version 1): the
# steady throughput became the windows' summed rate (``harness.experiments.steady``), and
# the drift-cancelled figures are over the round's reference (``with_drift_cancelled``)
DEFINITIONS = {metrics.STEADY_THROUGHPUT: 2, metrics.STEADY_PER_REFERENCE: 3,
               metrics.THROUGHPUT_PER_REFERENCE: 2, metrics.CPU_PER_REFERENCE: 2}
STABILITY = 0.10
DROP_EXTREMES_FROM = 5
# noisy metrics: name -> True when higher is better
METRICS = {name: metrics.get(name).higher_is_better for name in metrics.SUITE_METRICS}
# exact counters: must be identical between results of the same cell
COUNTERS = ("bytes_per_sample", "num_parameters", "steps_per_epoch",
            metrics.ACTIONS_PER_EPOCH)
RULE = {"centre": "median", "spread": "min-max of the kept values",
        "drop_extremes_from": DROP_EXTREMES_FROM, "stability": STABILITY}


@dataclass(frozen=True)
class Stat:
    median: float
    low: float
    high: float
    n: int
    values: tuple[float, ...]
    ci_low: float = math.nan  # the geometric mean's interval (``verdicts.interval``)
    ci_high: float = math.nan

    @property
    def rel_spread(self) -> float:
        return (self.high - self.low) / abs(self.median) if self.median else 0.0

    @property
    def stable(self) -> bool:
        return self.rel_spread <= STABILITY

    def to_json(self) -> dict:
        return {"median": self.median, "min": self.low, "max": self.high,
                "ci_low": _finite(self.ci_low), "ci_high": _finite(self.ci_high),
                "rel_spread": self.rel_spread, "n": self.n, "values": list(self.values),
                "stable": self.stable}


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def summarise(values) -> Stat | None:  # noqa: ANN001 - any iterable of numbers or None
    """The rule above over one cell's repeats (None and NaN left out)."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not vals:
        return None
    kept = sorted(vals)
    if len(kept) >= DROP_EXTREMES_FROM:
        kept = kept[1:-1]
    lo, hi = verdicts.interval(vals) if all(v > 0 for v in vals) else (math.nan, math.nan)
    return Stat(statistics.median(kept), kept[0], kept[-1], len(vals), tuple(vals), lo, hi)


def overhead_rows(cells: list[dict]) -> list[dict]:
    """Harness overhead from cells measured with tracking on and off: the relative loss
    of throughput (median over repeats) of the tracked cell."""
    by_key = {c["key"]: c for c in cells}
    out = []
    for c in cells:
        if not c["key"].endswith("/untracked"):
            continue
        on = by_key.get(c["key"][:-len("/untracked")])
        thr = metrics.THROUGHPUT
        if not on or thr not in on.get("metrics", {}) or thr not in c.get("metrics", {}):
            continue
        t_on, t_off = on["metrics"][thr]["median"], c["metrics"][thr]["median"]
        out.append({"cell": on["key"], "tracked": t_on, "untracked": t_off,
                    "overhead": 1 - t_on / t_off})
    return out


def cell_row(c: dict, single: float | None = None, mdc: float = math.inf) -> tuple:
    """One cell as a report row: system, status, config, microbatch, samples/s median,
    min-max, spread, steady-state samples/s [interval], MDC (given: the caller's rule
    states it), vs single, time to target, bytes/sample, peak memory, bubble."""
    thr = c.get("metrics", {}).get(metrics.THROUGHPUT)
    if c["status"] != "ok" or thr is None:
        why = c["status"] + (f": {c['note']}" if c.get("note") else "")
        return (c["system"], why) + ("",) * 12
    m = c["metrics"]
    ttt = m.get(metrics.TIME_TO_TARGET)
    reached = (f"{ttt['median']:.1f} s ({m[metrics.EPOCHS_TO_TARGET]['median']:.0f} ep, "
               f"{c.get('reached', ttt['n'])}/{len(c['run_ids'])})" if ttt else
               ("not reached" if c["mode"] == "time-to-target" else "-"))
    bubble = m.get(metrics.BUBBLE_FRACTION)
    mem = m.get(metrics.PEAK_MEMORY_MAX)
    steady = m.get(metrics.STEADY_THROUGHPUT)
    return (c["system"], "ok" if thr["stable"] else "ok ~", c.get("config") or "",
            c.get("microbatch") or "", f"{thr['median']:.0f}",
            f"{thr['min']:.0f}-{thr['max']:.0f}", f"{100 * thr['rel_spread']:.1f}%",
            _with_interval(steady), "-" if math.isinf(mdc) else f"{100 * mdc:.1f}%",
            f"{thr['median'] / single:.2f}x" if single else "-", reached,
            fmt_bytes(c["counters"].get("bytes_per_sample") or 0),
            fmt_bytes(mem["median"]) if mem else "-",
            f"{100 * bubble['median']:.0f}%" if bubble else "-")


def _with_interval(stat: dict | None) -> str:
    if not stat:
        return "-"
    if stat.get("ci_low") is None:
        return f"{stat['median']:.0f}"
    return f"{stat['median']:.0f} [{stat['ci_low']:.0f}, {stat['ci_high']:.0f}]"


def overhead_table(rows: list[dict]) -> tuple[tuple, list[tuple]]:
    """``overhead_rows`` as a header and rows for reports."""
    return (("cell", "tracked samples/s", "untracked samples/s", "overhead"),
            [(o["cell"], f"{o['tracked']:.0f}", f"{o['untracked']:.0f}",
              f"{100 * o['overhead']:+.1f}%") for o in rows])


def write_result(result: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")


def ok_cells(results: list[dict]) -> dict[str, list[dict]]:
    """Each cell key's cells that ran (status ok) over ``results``, in their order."""
    out: dict[str, list[dict]] = {}
    for c in (c for r in results for c in r["cells"] if c["status"] == "ok"):
        out.setdefault(c["key"], []).append(c)
    return out


def definition(result: dict, name: str) -> int:
    """The version of ``name``'s definition ``result`` was measured under."""
    return (result.get("definitions") or {}).get(name, 1)


def redefined(baseline: dict, current: dict) -> set[str]:
    """The figures ``baseline`` measured under another definition than ``current``."""
    names = {*DEFINITIONS, *(baseline.get("definitions") or {}),
             *(current.get("definitions") or {})}
    return {n for n in names if definition(baseline, n) != definition(current, n)}


def comparable(baselines: list[dict], current: dict) -> list[dict]:
    """``baselines``, each without the figures it measured under another definition than
    ``current`` (``DEFINITIONS``), so that no comparison spans a changed definition."""
    out = []
    for b in baselines:
        other = redefined(b, current)
        out.append({**b, "cells": [{**c, "metrics": {k: v for k, v in
                                                    c.get("metrics", {}).items()
                                                    if k not in other}}
                                   for c in b["cells"]]} if other else b)
    return out


def load_result(path: str | Path) -> dict:
    """A suite result file, checked for its schema."""
    p = Path(path)
    if not p.is_file():
        raise UserInputError(f"no suite result at {p}")
    return parse_result(p.read_bytes(), str(p))


def parse_result(text: str | bytes, where: str) -> dict:
    """A suite result's JSON text (from a file or an MLflow run's ``suite.json``: ``where``,
    for the error), checked for its schema, with the drift-cancelled figures it lacks."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserInputError(f"{where}: not a JSON suite result ({e})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UserInputError(f"{where}: not a {SCHEMA} result (schema "
                             f"{data.get('schema') if isinstance(data, dict) else None!r})")
    return with_drift_cancelled(data)


def round_speeds(result: dict) -> dict:
    """The drift reference of each repeat round of ``result``, per number of workers (the
    reference runs on a cell's workers' threads, so cells on as many workers share it):
    {workers: [the median over that round's cells of their reference speed, round by
    round]}. A cell's reference values are in repeat order and a cell stops at its first
    failure, so its i-th value was measured in round i."""
    by_round: dict = {}
    for cell in result.get("cells", []):
        speeds = cell.get("metrics", {}).get(metrics.REFERENCE_SPEED, {}).get("values", [])
        if len(speeds) != len(cell.get("run_ids", speeds)):
            continue  # a repeat without its speed: no longer round by round
        rounds = by_round.setdefault(cell.get("workers"), [])
        for i, v in enumerate(speeds):
            if i == len(rounds):
                rounds.append([])
            rounds[i].append(v)
    return {w: [statistics.median(r) for r in rounds] for w, rounds in by_round.items()}


def with_drift_cancelled(result: dict) -> dict:
    """``result`` (a suite result, as read or as a suite run ends) with each drift-cancelled
    figure (``metrics.DRIFT_PAIRS``) derived from the raw figure's repeats and the drift
    reference of their rounds (``round_speeds``; ``metrics.cancel_drift``), whatever the
    result held before (a result from before this definition divided each repeat by its
    own reference: its twins are derived again, so results of both ages compare).

    Why the round's reference, not the repeat's own: one half-second timing of the
    reference is noisier than the drift it is there to cancel and barely follows the
    repeat it precedes, so dividing each repeat by its own added noise to the twin; the
    median over a round's cells keeps what moves the whole machine for the minutes of a
    round and averages the timing's noise away (measured on the kept power runs:
    ``scripts/round_blocking.py``, ``results/round-blocking.md``). A cell whose raw figure
    misses a repeat (a summary leaves missing values out) no longer pairs up round by round
    and gets no twin."""
    speeds = round_speeds(result)
    for cell in result.get("cells", []):
        stats = cell.get("metrics", {})
        rounds = speeds.get(cell.get("workers"), [])
        repeats = len(cell.get("run_ids", stats.get(metrics.REFERENCE_SPEED, {})
                                .get("values", [])))
        for raw, cancelled in metrics.DRIFT_PAIRS.items():
            stats.pop(cancelled, None)
            values = stats.get(raw, {}).get("values", [])
            if not values or not len(values) == repeats <= len(rounds):
                continue
            stat = summarise(metrics.cancel_drift(raw, v, s)
                             for v, s in zip(values, rounds[:repeats], strict=True))
            if stat is not None and stat.n == len(values):
                stats[cancelled] = stat.to_json()
    # derived now, each twin is of today's definition where its raw figure is
    current = {c: DEFINITIONS[c] for r, c in metrics.DRIFT_PAIRS.items()
               if definition(result, r) == DEFINITIONS.get(r, 1)}
    result["definitions"] = {**(result.get("definitions") or {}), **current}
    return result
