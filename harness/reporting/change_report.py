"""What a regressions report says about a comparison's changes: its table, what it could
detect, what it compared and the runtime switches that differ.

Why: ``regressions`` decides what moved and whether it is a regression; the words a
report (``pipebench regressions``, the dashboard) puts around those decisions have their
own home, so the rule's module holds the rule alone.
"""

from __future__ import annotations

import math

from harness import metrics
from harness.reporting import verdicts
from harness.reporting.regressions import Change

__all__ = ["COLUMNS", "compared", "detectability", "rows", "switches_differ"]

COLUMNS = ("verdict", "cell", "what", "baseline", "current", "change", "flagged beyond",
           "MDC")


def detectability(changes: list[Change]) -> str:
    """One line: how many judged metrics can see a ``verdicts.TARGET_MDC`` change (and, where
    some are judged over nights, how many of those MDCs are the two nights'), and which
    throughput cells cannot."""
    judged = [c for c in changes if c.mdc is not None
              and not c.verdict.startswith("not judged")]
    blind = sorted({c.cell for c in judged if c.name in metrics.THROUGHPUT_FIGURES
                    and not c.mdc <= verdicts.TARGET_MDC})
    can = sum(1 for c in judged if c.mdc <= verdicts.TARGET_MDC)
    line = (f"{can} of {len(judged)} judged metrics can detect a "
            f"{verdicts.TARGET_MDC:.0%} change")
    paired = sum(c.two_nights for c in judged)
    if paired:  # over nights the history decides which MDC a metric has: say which
        line += (f" ({paired} of them by the MDC of a change lasting two nights, which "
                 "the regression label needs, the rest by one comparison's)")
    if blind:
        line += (f"; throughput cells that cannot ({len(blind)}): " + ", ".join(blind))
    return line + "."


def compared(baselines: list[dict], current: dict) -> str:
    """A report's line naming what it compared: each result's commit and the time its
    suite run finished (``created``)."""
    def one(r: dict) -> str:
        return f"{r.get('environment', {}).get('git_sha', 'unknown')} ({r['created']})"
    return f"Current: {one(current)}. Against: {', '.join(one(b) for b in baselines)}."


def switches_differ(baselines: list[dict], current: dict) -> list[str]:
    """A report's lines (the note and a blank) where the runtime switches set
    (``environment.runtime_env``) differ between the baselines and the current result, so
    that a move they cause is not read as the code's; none where they agree or a result
    (from before they were recorded) lacks them."""
    def env(result: dict) -> str | None:
        return result.get("environment", {}).get("runtime_env")
    now, before = env(current), {env(b) for b in baselines}
    if now is None or None in before or before == {now}:
        return []
    return [f"Runtime switches differ: the baseline ran with {', '.join(sorted(before))}, "
            f"the current result with {now}; what they change is in the comparison.", ""]


def rows(changes: list[Change], everything: bool = False) -> list[tuple]:
    """Report rows: what moved (``everything``: also the moves within the noise)."""
    def fmt(v) -> str:  # noqa: ANN001
        return f"{v:.4g}" if isinstance(v, float) else "" if v is None else str(v)

    def pct(v: float | None, sign: str = "") -> str:
        if v is None or math.isnan(v):
            return ""
        return "inf" if math.isinf(v) else f"{100 * v:{sign}.1f}%"
    quiet = ("changed-within-noise", "too-few-repeats", "insufficient data")
    return [(c.verdict, c.cell, c.name, fmt(c.baseline), fmt(c.current),
             pct(c.change, "+"), pct(c.threshold), pct(c.mdc))
            for c in changes if everything or not (
                c.verdict in quiet or c.verdict.startswith("not judged"))]
