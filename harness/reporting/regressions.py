"""What moved between suite results, and whether it is a regression.

Why: a nightly benchmark is only useful if it says, without a person reading numbers,
that something got worse, and does not cry wolf over the noise of a shared machine.

Rules (the cell key matches cells across results; see ``results`` for the statistics):
- counters (``results.COUNTERS``: bytes per sample, parameter count, steps and actions per
  epoch) must be identical: any difference, however small, is a regression; except the
  counters that depend on the layout (``LAYOUT_COUNTERS``) where the two cells ran
  different layouts (``config`` and ``split``, the replicas and layer ranges: the planner
  decides them on a profile, and one measured in each suite run lets a near-tie fall
  either way on one commit; a suite's committed profiles, once remade, move them too):
  then those are listed, not judged;
- a noisy metric (``results.METRICS``) is judged by ``verdicts.test``: a one-sided t-test
  of the repeats' logs against one or two baselines, or of the result against the
  prediction interval of a history of results, at a false-alarm rate ``alpha`` per metric
  (``verdicts.ALPHA`` unless given; the reports pass ``family_alpha``'s: a rate per
  comparison split over its ``judged`` metrics), each cell's noise moderated by the same
  metric's over the comparison's cells (``priors``); each change carries the smallest
  move the cell could have flagged (``threshold``) and its minimum detectable change
  (``mdc``); of a figure measured raw and cancelled for the machine's drift
  (``metrics.DRIFT_PAIRS``) only one
  is judged, the other is listed as not judged: the drift-cancelled one where the cell's
  drift reference moved between the baseline and the current result (``verdicts.moved``),
  flagged only where the raw figure broke the same way too (the reference's own move must
  not be flagged through it), else the one whose baseline was stabler; either way a pair
  is flagged at a rate of at most ``alpha`` (``tests/.../test_regressions.py``);
- a cell that ran before and now fails or is refused is a regression, and so is a
  time-to-target cell whose share of repeats reaching the target fell, or a metric that
  was measured before and no longer is; cells only in one result are listed (``missing``
  / ``new``) but are not regressions.
Counters compare with the newest baseline in which the cell ran. Against a history
(``over_nights``) the noisy metrics are labelled over nights as PyTorch's benchmark HUD
does (``verdicts.night_label``): two nights in a row beyond the two nights' threshold are a
``regression`` (each night tested at ``verdicts.consecutive_level``, so that the pair's
false-alarm rate is ``alpha``), tonight alone beyond the one night's threshold (at
``alpha``) ``suspicious``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from harness import metrics
from harness.reporting import moderation, verdicts
from harness.reporting.results import COUNTERS, METRICS, comparable, ok_cells, redefined, summarise

__all__ = ["Change", "cells_by_key", "compare_at_rate", "compare_results", "family_alpha",
           "has_regression", "judged", "judged_against", "night_alpha", "not_judged", "over_nights",
           "over_nights_at_rate", "priors", "reference_moved"]

# the counters that depend on the stages, their replicas and layer ranges
LAYOUT_COUNTERS = ("bytes_per_sample", metrics.ACTIONS_PER_EPOCH)


@dataclass(frozen=True)
class Change:
    cell: str
    name: str  # metric, counter or "status"
    verdict: str  # regression | improvement | changed-within-noise | missing | new
    baseline: float | str | None = None
    current: float | str | None = None
    change: float | None = None  # relative, current / baseline - 1
    threshold: float | None = None  # the relative move the rule flags at (0: any)
    mdc: float | None = None  # minimum detectable change (verdicts.POWER, alpha)
    two_nights: bool = False  # mdc is a change lasting two nights' (verdicts.Test)
    df: float | None = None  # the noise estimate's degrees of freedom (a prior's counted)


def cells_by_key(result: dict) -> dict[str, dict]:
    """A result's cells by key (``priors``' ``cur``)."""
    return {c["key"]: c for c in result["cells"]}


def compare_results(baselines: list[dict], current: dict, alpha: float = verdicts.ALPHA,
                    consecutive: bool = False, moderate: bool = True) -> list[Change]:
    """Every difference worth a line; ``baselines`` oldest first (one or the history).
    ``consecutive``: the noisy metrics judged as one of two nights over a history
    (``verdicts.consecutive_level``, with the two nights' MDC), where it is one.
    ``moderate``: each metric's noise moderated by the same metric's over the cells
    (``priors``); False: each cell's own alone."""
    if not baselines:
        return []
    changed = {n for b in baselines for n in redefined(b, current)}
    baselines = comparable(baselines, current)  # no figure across a changed definition
    newest = cells_by_key(baselines[-1])
    pooled = ok_cells(baselines)
    cur = cells_by_key(current)
    prior = priors(pooled, cur) if moderate else {}
    out: list[Change] = []
    for key in sorted(set(newest) | set(pooled)):
        if key not in cur:
            out.append(Change(key, "cell", "missing"))
            continue
        c = cur[key]
        ran_before = key in pooled
        if c["status"] != "ok":
            if ran_before:
                out.append(Change(key, "status", "regression", "ok",
                                  f"{c['status']}: {c.get('note', '')}"))
            continue
        if not ran_before:
            continue
        out += _counter_changes(key, pooled[key][-1], c)  # the newest baseline that ran
        found = _metric_changes(key, pooled[key], c, alpha, consecutive, prior)
        seen = {f.name for f in found}
        out += found + [Change(key, n, "not judged (its definition changed)", None,
                               c["metrics"][n]["median"])
                        for n in sorted(changed) if n in c["metrics"] and n not in seen]
        out += _reach_changes(key, pooled[key], c)
    out += [Change(k, "cell", "new") for k in sorted(set(cur) - set(newest) - set(pooled))]
    return out


def priors(pooled: dict[str, list[dict]], cur: dict[str, dict], cell_df: float | None = None
           ) -> dict[tuple[str, bool], moderation.Prior]:
    """Each noisy metric's prior noise (``moderation.fit``, on the cells' deviations: their
    variances and how much they move together; ``cell_df`` its) over the cells that ran in
    both ``pooled`` (the baselines' cells by key) and ``cur``, fitted apart for cells judged
    by repeats and by results (``verdicts.by_results``: the two noises differ)."""
    found: dict[tuple[str, bool], list[tuple[list[float], int]]] = {}
    for key, bases in pooled.items():
        c = cur.get(key, {})
        for name, higher_better in METRICS.items():
            groups = [b["metrics"][name]["values"] for b in bases if name in b.get("metrics", {})]
            if c.get("status") != "ok" or higher_better is None or not groups or \
                    name not in c.get("metrics", {}):
                continue
            dev, df = verdicts.spread(groups, c["metrics"][name]["values"])
            if df:
                found.setdefault((name, verdicts.by_results(groups)), []).append((dev, df))
    return {k: moderation.fit_spreads(v, cell_df) for k, v in found.items()}


def judged(changes: list[Change]) -> list[Change]:
    """The noisy metrics a comparison judged with a noise estimate (a finite MDC: not the
    twin left unjudged, not too few repeats): those that could flag."""
    return [c for c in changes if c.name in METRICS and c.mdc is not None
            and math.isfinite(c.mdc) and not c.verdict.startswith("not judged")]


def family_alpha(baselines: list[dict], current: dict, rate: float = verdicts.SUITE_ALPHA,
                 moderate: bool = True) -> tuple[float, int]:
    """The level per metric at which comparing ``current`` with ``baselines`` flags falsely
    at ``rate`` at most (``verdicts.per_metric``), and how many metrics it judges (which
    metrics are judged does not depend on the level)."""
    m = len(judged(compare_results(baselines, current, moderate=moderate)))
    return verdicts.per_metric(m, rate), m


def night_alpha(history: list[dict], current: dict, window: int,
                rate: float = verdicts.SUITE_ALPHA, moderate: bool = True
                ) -> tuple[float, int]:
    """``family_alpha`` of the comparison ``over_nights`` labels tonight's noisy metrics on:
    ``current`` against ``judged_against(history, window)``."""
    return family_alpha(judged_against(history, window), current, rate, moderate)


def compare_at_rate(baselines: list[dict], current: dict, rate: float = verdicts.SUITE_ALPHA,
                    moderate: bool = True) -> tuple[list[Change], float, int]:
    """``compare_results`` at the level ``family_alpha`` gives the comparison (false alarms
    at ``rate`` per comparison): its changes, that level and the metrics it judged."""
    level, m = family_alpha(baselines, current, rate, moderate)
    return compare_results(baselines, current, level, moderate=moderate), level, m


def over_nights_at_rate(history: list[dict], current: dict, window: int,
                        rate: float = verdicts.SUITE_ALPHA, moderate: bool = True
                        ) -> tuple[list[Change], float, int]:
    """``over_nights`` at the level ``night_alpha`` gives tonight (false alarms at ``rate``
    per night): its changes, that level and the metrics it judged."""
    level, m = night_alpha(history, current, window, rate, moderate)
    return over_nights(history, current, window, level, moderate), level, m


def over_nights(history: list[dict], current: dict, window: int,
                alpha: float = verdicts.ALPHA, moderate: bool = True) -> list[Change]:
    """``compare_results`` of ``current`` against the last ``window`` of ``history`` (oldest
    first), its noisy metrics judged over nights (``verdicts.night_label``): tonight and
    the night before (``history[-1]``) are each tested against the same ``window`` results
    before the night before, so that a shift seen last night does not widen tonight's
    threshold; both beyond the two nights' threshold the same way is a ``regression``
    (its MDC the two nights'), tonight alone beyond the one night's threshold is
    ``suspicious`` (that threshold shown), fewer than ``verdicts.MIN_HISTORY`` such results
    (that ran the cell and measured the figure under tonight's definition: ``comparable``)
    ``insufficient data``.
    Exact counters, failures and lost targets stay regressions on the first night.
    ``moderate``: as ``compare_results``'."""
    def compare(bases: list[dict], cur: dict, consecutive: bool = False) -> list[Change]:
        return compare_results(bases, cur, alpha, consecutive, moderate)
    direct = compare(history[-window:], current)
    base = judged_against(history, window)
    now = {(c.cell, c.name): c for c in compare(base, current, True)}
    # last night's verdict per figure, a drift pair's under either twin: the twin judged
    # can differ between the nights (``reference_moved`` looks at each night's reference)
    before = {(c.cell, _twins(c.name)): c.verdict
              for c in compare(base, history[-1], True)
              if not c.verdict.startswith("not judged")}
    strict = {(c.cell, c.name): c for c in compare(base, current)}
    have = ok_cells(comparable(base, current))  # the history each figure of a cell has
    out = []
    for c in direct:
        if c.name in METRICS:
            key = (c.cell, c.name)
            if key in now:
                c = now[key]
                if not c.verdict.startswith("not judged"):
                    was = before.get((c.cell, _twins(c.name)), "ok")
                    n = sum(c.name in b["metrics"] for b in have.get(c.cell, []))
                    label = verdicts.night_label([was, c.verdict], n, strict[key].verdict)
                    if label not in verdicts.BROKEN:  # judged on the one night's threshold
                        c = replace(c, threshold=strict[key].threshold)
                    c = replace(c, verdict="changed-within-noise" if label == "ok"
                                else label)
            elif not c.verdict.startswith("not judged"):
                c = replace(c, verdict="insufficient data")
        out.append(c)
    return out


# each drift-cancelled figure's raw twin (``metrics.DRIFT_PAIRS`` inverted)
_RAW = {cancelled: raw for raw, cancelled in metrics.DRIFT_PAIRS.items()}


def _twins(name: str) -> str:
    """A drift pair's raw figure for either of its twins; any other figure itself."""
    return _RAW.get(name, name)


def judged_against(history: list[dict], window: int) -> list[dict]:
    """The results tonight's noisy metrics are judged on over nights: up to ``window``
    before last night (``history[-1]``), so last night's shift does not widen the rule."""
    return history[:-1][-window:]


def _layout(cell: dict) -> str | None:
    """The cell's replicas per stage and layer ranges, e.g. ``1-1 0-16|16-40`` (None: not
    recorded, in results from before the split was)."""
    return f"{cell.get('config')} {cell['split']}" if cell.get("split") else None


def _counter_changes(key: str, base: dict, cur: dict) -> list[Change]:
    out = []
    was, now = _layout(base), _layout(cur)
    moved = was and now and was != now
    for name in COUNTERS:
        a, b = base.get("counters", {}).get(name), cur.get("counters", {}).get(name)
        if a != b:
            rel = (b / a - 1) if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
                and a else None
            verdict = f"not judged (layout {was} -> {now})" \
                if moved and name in LAYOUT_COUNTERS else "regression"
            out.append(Change(key, name, verdict, a, b, rel, 0.0))
    if not cur.get("counters_consistent", True):
        out.append(Change(key, "counters", "regression", "consistent",
                          "differ between repeats"))
    return out


def _reached_share(cell: dict) -> float:
    return cell.get("reached", 0) / max(1, len(cell.get("run_ids", [])))


def _reach_changes(key: str, base_cells: list[dict], cur: dict) -> list[Change]:
    """Reaching the target less often is a regression (the time-to-target medians count
    only the repeats that reached it)."""
    before = min(_reached_share(c) for c in base_cells)
    now = _reached_share(cur)
    if cur.get("mode") == "time-to-target" and now < before:
        return [Change(key, "target reached", "regression", f"{before:.0%} of repeats",
                       f"{now:.0%} of repeats")]
    return []


def not_judged(base_cells: list[dict], drifted: bool = False) -> dict[str, str]:
    """Of each figure measured raw and drift-cancelled (``metrics.DRIFT_PAIRS``), the one
    not judged -> the one judged instead: the raw one where the drift reference moved
    (``drifted``: ``reference_moved``), else the one whose baseline was the noisier."""
    out = {}
    if drifted:
        return {raw: cancelled for raw, cancelled in metrics.DRIFT_PAIRS.items()
                if all(cancelled in c.get("metrics", {}) for c in base_cells)}
    for raw, cancelled in metrics.DRIFT_PAIRS.items():
        sds = {n: verdicts.noise([c["metrics"][n]["values"] for c in base_cells
                                  if n in c.get("metrics", {})]) for n in (raw, cancelled)}
        if not any(math.isnan(v) for v in sds.values()):
            quiet, loud = sorted((raw, cancelled), key=sds.get)
            out[loud] = quiet
    return out


def reference_moved(base_cells: list[dict], cur: dict) -> bool:
    """Whether the cell's drift reference moved from the baseline's cells to ``cur``
    (``verdicts.moved``); False where either lacks it."""
    ref = metrics.REFERENCE_SPEED
    groups = [c["metrics"][ref]["values"] for c in base_cells if ref in c.get("metrics", {})]
    return bool(groups) and ref in cur.get("metrics", {}) and verdicts.moved(
        groups, cur["metrics"][ref]["values"])


def _metric_changes(key: str, base_cells: list[dict], cur: dict, alpha: float,
                    consecutive: bool = False, prior: dict | None = None) -> list[Change]:
    out = []
    drifted = reference_moved(base_cells, cur)
    skip = not_judged(base_cells, drifted)
    why = "judged: the drift reference moved" if drifted else "stabler"
    tests: dict[str, tuple] = {}
    for name, higher_better in METRICS.items():
        if name not in cur.get("metrics", {}):
            if all(name in c.get("metrics", {}) for c in base_cells) and \
                    name not in metrics.TARGET_METRICS:
                out.append(Change(key, name, "regression", "measured", "missing"))
            continue  # (a target no longer reached: _reach_changes)
        groups = [c["metrics"][name]["values"] for c in base_cells
                  if name in c.get("metrics", {})]
        base = summarise(v for g in groups for v in g)
        now = summarise(cur["metrics"][name]["values"])
        if base is None or now is None or base.median == 0:
            continue
        if higher_better is None:  # not a figure of merit (the reference itself)
            continue
        fitted = (prior or {}).get((name, verdicts.by_results(groups)), moderation.NONE)
        tests[name] = (base, now, verdicts.test(groups, cur["metrics"][name]["values"],
                                                higher_better, alpha, consecutive, fitted))
    for name, (base, now, r) in tests.items():
        broke = r.broke
        raw = _RAW.get(name)
        if drifted and raw in skip and raw in tests:
            # judged because the reference moved: a flag needs the raw figure to break the
            # same way too, else the reference's own move would be flagged through its
            # divisor or factor (its choice looked at the reference's current values)
            broke = broke and tests[raw][2].verdict == r.verdict
        verdict = r.verdict if broke else (
            "too-few-repeats" if r.verdict == "too-few-repeats" else "changed-within-noise")
        if name in skip:  # the other twin is judged; this one is shown, not judged
            verdict = f"not judged ({skip[name]} {why})"
        out.append(Change(key, name, verdict, base.median, now.median, r.change,
                          r.flag_at, r.mdc, r.two_nights, r.df))
    return out


def has_regression(changes: list[Change]) -> bool:
    """Whether any change is a regression (what fails a nightly)."""
    return any(c.verdict == "regression" for c in changes)
