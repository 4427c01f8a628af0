"""What moved between suite results, and whether it is a regression.

Why: a nightly benchmark is only useful if it says, without a person reading numbers,
that something got worse, and does not cry wolf over the noise of a shared machine.

Rules (the cell key matches cells across results; see ``results`` for the statistics):
- counters (``results.COUNTERS``: bytes per sample, parameter count, steps and actions per
  epoch) must be identical: any difference, however small, is a regression;
- a noisy metric (``results.METRICS``) regresses when its median moved in the bad
  direction by more than ``max(min_threshold, spread_baseline + spread_current)``, spreads
  being (max - min) / median of each side's repeats: the medians must leave the band the
  two runs' own scatter allows. The same move in the good direction is an improvement;
- a cell that ran before and now fails or is refused is a regression, and so is a
  time-to-target cell whose share of repeats reaching the target fell, or a metric that
  was measured before and no longer is; cells only in one result are listed (``missing``
  / ``new``) but are not regressions.
Against history (several baseline results) the baselines' repeats are pooled into one
sample per metric; counters compare with the newest baseline in which the cell ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import metrics
from harness.reporting.results import COUNTERS, METRICS, summarise

__all__ = ["MIN_THRESHOLD", "Change", "compare_results", "has_regression", "rows"]

MIN_THRESHOLD = 0.05


@dataclass(frozen=True)
class Change:
    cell: str
    name: str  # metric, counter or "status"
    verdict: str  # regression | improvement | changed-within-noise | missing | new
    baseline: float | str | None = None
    current: float | str | None = None
    change: float | None = None  # relative, current / baseline - 1
    threshold: float | None = None


def _cells(result: dict) -> dict[str, dict]:
    return {c["key"]: c for c in result["cells"]}


def compare_results(baselines: list[dict], current: dict,
                    min_threshold: float = MIN_THRESHOLD) -> list[Change]:
    """Every difference worth a line; ``baselines`` oldest first (one or the history)."""
    if not baselines:
        return []
    newest = _cells(baselines[-1])
    pooled: dict[str, list[dict]] = {}
    for b in baselines:
        for key, c in _cells(b).items():
            if c["status"] == "ok":
                pooled.setdefault(key, []).append(c)
    cur = _cells(current)
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
        out += _metric_changes(key, pooled[key], c, min_threshold)
        out += _reach_changes(key, pooled[key], c)
    out += [Change(k, "cell", "new") for k in sorted(set(cur) - set(newest) - set(pooled))]
    return out


def _counter_changes(key: str, base: dict, cur: dict) -> list[Change]:
    out = []
    for name in COUNTERS:
        a, b = base.get("counters", {}).get(name), cur.get("counters", {}).get(name)
        if a != b:
            rel = (b / a - 1) if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
                and a else None
            out.append(Change(key, name, "regression", a, b, rel, 0.0))
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


def _metric_changes(key: str, base_cells: list[dict], cur: dict,
                    min_threshold: float) -> list[Change]:
    out = []
    for name, higher_better in METRICS.items():
        if name not in cur.get("metrics", {}):
            if all(name in c.get("metrics", {}) for c in base_cells) and \
                    name not in metrics.TARGET_METRICS:
                out.append(Change(key, name, "regression", "measured", "missing"))
            continue  # (a target no longer reached: _reach_changes)
        base = summarise(v for c in base_cells for v in c.get("metrics", {}).get(name, {})
                         .get("values", []))
        now = summarise(cur["metrics"][name]["values"])
        if base is None or now is None or base.median == 0:
            continue
        change = now.median / base.median - 1
        threshold = max(min_threshold, base.rel_spread + now.rel_spread)
        worse = change < 0 if higher_better else change > 0
        if abs(change) <= threshold:
            verdict = "changed-within-noise"
        else:
            verdict = "regression" if worse else "improvement"
        out.append(Change(key, name, verdict, base.median, now.median, change, threshold))
    return out


def has_regression(changes: list[Change]) -> bool:
    return any(c.verdict == "regression" for c in changes)


def rows(changes: list[Change], everything: bool = False) -> list[tuple]:
    """Report rows: what moved (``everything``: also the moves within the noise)."""
    def fmt(v) -> str:  # noqa: ANN001
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    return [(c.verdict, c.cell, c.name, fmt(c.baseline), fmt(c.current),
             "" if c.change is None else f"{100 * c.change:+.1f}%",
             "" if c.threshold is None else f"{100 * c.threshold:.1f}%")
            for c in changes if everything or c.verdict != "changed-within-noise"]
