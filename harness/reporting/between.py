"""How much more two results differ than their repeats say, and what that does to the pair
test's false-alarm rate.

Why: ``verdicts.test`` judges a pair of results (one baseline, one current) by their
repeats alone: the noise is the repeats' deviation about each result's mean. Repeats run
close together (one repeat round of a suite follows the other within minutes); two results
run hours or days apart, and the machine moves in between (clock, neighbours, the address
space a fresh process draws). If the means of results vary more than their repeats
predict, the pair test flags more often than its ``alpha``. This measures by how much, from
results of one suite on one machine (an A/A series: ``scripts/nightly_power.py``), so that
the report can set the flags it saw beside the flags the measured noise predicts.

The model (per metric, on logarithms as ``verdicts``): a cell's repeat ``j`` of result
``i`` is ``mu + b_i + e_ij`` with between-result noise ``b_i`` (variance ``tau^2``) and
repeat noise ``e_ij`` (``sigma^2``). The mean of ``n`` repeats varies by
``tau^2 + sigma^2 / n`` where the repeats predict ``sigma^2 / n``; ``ratio`` is the pooled
quotient of the two (1: the repeats tell the whole noise), over the cells that ran in
every result.

A pair test of two results' means then sees ``t = sqrt(ratio) * T`` with ``T`` Student's
t on the repeats' degrees of freedom (the difference of two means varies by
``2 tau^2 + sigma^2 (1/n_a + 1/n_b)``, which is ``ratio`` times what the repeats predict
where both have ``n`` repeats), so its one-sided false-alarm rate is
``P(T > critical / sqrt(ratio))`` (``pair_rate``; the rule's 2% floor only lowers it), on
the test's own degrees of freedom (a moderated noise's are more: ``moderation``).

``report`` writes both into ``scripts/nightly_power.py``'s reports: each metric's ratio over
an A/A series and in each pair, and each pair's flags beside the flags its ratios predict.

The same quotient could be estimated from one pair across its cells (genomic control's
inflation factor) and divided out; measured on the power suite, that hid a planted 1.2x
slowdown of every cell entirely (the slowdown is the inflation), so the rule does not do
it: a regression of our runtime moves many cells at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.markdown import markdown_table
from harness.reporting import verdicts
from harness.reporting.regressions import Change, judged

__all__ = ["Inflation", "inflation", "pair_rate", "report"]


@dataclass(frozen=True)
class Inflation:
    ratio: float  # variance of results' means over what their repeats predict (nan: none)
    cells: int  # the cells it is pooled over
    results: int  # the results each of them ran in
    repeats: int  # the typical (median) repeats of a result of a cell


def inflation(results: list[dict], name: str) -> Inflation:
    """``ratio`` of metric ``name`` over ``results`` (suite results of one suite, two or
    more), pooled over the cells with two or more repeats of it in every result: the sum
    over cells of the results' means' variance over the sum of what their repeats predict
    (the pooled repeat variance times the mean of ``1/n``)."""
    by_key = [{c["key"]: c for c in r["cells"] if c["status"] == "ok"} for r in results]
    keys = set.intersection(*(set(k) for k in by_key)) if by_key else set()
    between = predicted = 0.0
    used, sizes = 0, []
    for key in sorted(keys):
        groups = [verdicts.log_values(cells[key].get("metrics", {}).get(name, {})
                                      .get("values", [])) for cells in by_key]
        if len(groups) < 2 or any(len(g) < 2 for g in groups):
            continue
        means = [sum(g) / len(g) for g in groups]
        ss, df = verdicts.centred(groups)
        between += verdicts.centred([means])[0] / (len(means) - 1)
        predicted += ss / df * sum(1 / len(g) for g in groups) / len(groups)
        used += 1
        sizes += [len(g) for g in groups]
    ratio = between / predicted if predicted > 0 else math.nan
    return Inflation(ratio, used, len(results), sorted(sizes)[len(sizes) // 2] if sizes
                     else 0)


def pair_rate(ratio: float, repeats: int, alpha: float = verdicts.ALPHA,
              df: float | None = None) -> float:
    """The pair test's one-sided false-alarm rate (``verdicts.test`` with one baseline of
    ``repeats`` against a current result of as many) when the results' means vary
    ``ratio`` times as much as their repeats predict; ``alpha`` at a ratio of 1. ``df``:
    the test's degrees of freedom (None: the repeats', 2 x repeats - 2; more where a prior
    moderates the noise, and then a ratio above 1 costs more: the critical value is lower,
    and the t's tail thinner)."""
    df = 2 * repeats - 2 if df is None else df
    if df < 1 or not math.isfinite(ratio) or ratio <= 0:
        return math.nan
    critical = verdicts.t_ppf(1 - alpha, df)
    return verdicts.t_sf(critical / math.sqrt(ratio), df)


def report(runs: list[dict], pairs: list[tuple[int, list[Change]]],
           levels: dict[int, float]) -> list[str]:
    """Report lines: each noisy metric's ``ratio`` over all ``runs`` and in each pair
    (``pairs``: the index of each later run and its changes against the run before, as
    ``regressions.compare_results`` gives them at the pair's level per metric,
    ``levels[i]``), and each pair's flags, either direction, beside those expected at that
    level and at the pair's own ratios (twice ``pair_rate`` a metric: the rule tests each
    direction at its rate); none where no pair judged a metric with a noise estimate."""
    names = sorted({c.name for _, ch in pairs for c in judged(ch)})
    if not names:
        return []
    ratio = {(i, n): inflation(runs[i - 1:i + 1], n) for i, _ in pairs for n in names}
    rows = [(n, f"{inflation(runs, n).ratio:.2f}",
             *(f"{ratio[i, n].ratio:.2f}" for i, _ in pairs)) for n in names]
    tally = []
    for i, ch in pairs:
        its = judged(ch)
        expect = sum(2 * pair_rate(max(1.0, ratio[i, c.name].ratio), ratio[i, c.name].repeats,
                                   levels[i], c.df) for c in its)
        tally.append((f"A{i} vs A{i + 1}", str(len(its)), f"{levels[i]:.2g}",
                      str(sum(c.verdict in verdicts.BROKEN for c in its)),
                      f"{2 * levels[i] * len(its):.2f}", f"{expect:.2f}"))
    return ["Between results: how much more the runs' means vary than their repeats predict "
            "(variance of the means over the repeats' variance / n, pooled over the cells "
            "that ran in every run compared; 1: the repeats tell the whole noise; "
            "`harness/reporting/between.py`), over all the A runs and in each pair:", "",
            *markdown_table(("metric", "all runs", *(f"A{i} vs A{i + 1}" for i, _ in pairs)),
                            rows), "",
            "The pair test takes the repeats as the whole noise, so at a ratio r its "
            "false-alarm rate per metric and direction is P(T > t_crit / sqrt(r)) instead of "
            "the level it tests at. Each pair's flags (either direction) against those "
            "expected at its level and at the pair's own measured ratios (a ratio under 1 "
            "counted as 1). Two caveats: a pair's ratio is measured on the same two runs "
            "whose flags it is set beside, so it is a consistency check, not a forecast; "
            "and one pooled ratio per metric stands for all its cells, where a machine-wide "
            "shift would raise the quiet cells' own ratio above it and the noisy cells' "
            "below, so the expected count is, if anything, low. On one commit every flag "
            "is a false alarm; across commits a real change also raises the ratio.", "",
            *markdown_table(("pair", "judged metrics", "level per metric", "flags",
                             "expected at that level", "expected at the measured ratios"),
                            tally), ""]
