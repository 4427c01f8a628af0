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
``P(T > critical / sqrt(ratio))`` (``pair_rate``; the rule's 2% floor only lowers it).

The same quotient could be estimated from one pair across its cells (genomic control's
inflation factor) and divided out; measured on the power suite, that hid a planted 1.2x
slowdown of every cell entirely (the slowdown is the inflation), so the rule does not do
it: a regression of our runtime moves many cells at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from harness.reporting import verdicts

__all__ = ["Inflation", "inflation", "pair_rate"]


@dataclass(frozen=True)
class Inflation:
    ratio: float  # variance of results' means over what their repeats predict (nan: none)
    cells: int  # the cells it is pooled over
    results: int  # the results each of them ran in
    repeats: int  # the typical (median) repeats of a result of a cell


def _logs(values) -> list[float]:  # noqa: ANN001 - numbers
    return [math.log(v) for v in values if v is not None and v > 0 and math.isfinite(v)]


def inflation(results: list[dict], name: str) -> Inflation:
    """``ratio`` of metric ``name`` over ``results`` (suite results of one suite, two or
    more), pooled over the cells with two or more repeats of it in every result: the sum
    over cells of the results' means' variance over the sum of what their repeats predict
    (the pooled repeat variance times the mean of ``1/n``)."""
    keys = set.intersection(*({c["key"] for c in r["cells"] if c["status"] == "ok"}
                              for r in results)) if results else set()
    between = predicted = 0.0
    used, sizes = 0, []
    for key in sorted(keys):
        groups = []
        for r in results:
            cell = next(c for c in r["cells"] if c["key"] == key)
            logs = _logs(cell.get("metrics", {}).get(name, {}).get("values", []))
            groups.append(logs)
        if len(groups) < 2 or any(len(g) < 2 for g in groups):
            continue
        means = [sum(g) / len(g) for g in groups]
        centre = sum(means) / len(means)
        ss = sum((x - m) ** 2 for g, m in zip(groups, means, strict=True) for x in g)
        df = sum(len(g) - 1 for g in groups)
        between += sum((m - centre) ** 2 for m in means) / (len(means) - 1)
        predicted += ss / df * sum(1 / len(g) for g in groups) / len(groups)
        used += 1
        sizes += [len(g) for g in groups]
    ratio = between / predicted if predicted > 0 else math.nan
    return Inflation(ratio, used, len(results), sorted(sizes)[len(sizes) // 2] if sizes
                     else 0)


def pair_rate(ratio: float, repeats: int, alpha: float = verdicts.ALPHA) -> float:
    """The pair test's one-sided false-alarm rate (``verdicts.test`` with one baseline of
    ``repeats`` against a current result of as many) when the results' means vary
    ``ratio`` times as much as their repeats predict; ``alpha`` at a ratio of 1."""
    df = 2 * repeats - 2
    if df < 1 or not math.isfinite(ratio) or ratio <= 0:
        return math.nan
    critical = stats.t.ppf(1 - alpha, df)
    return float(stats.t.sf(critical / math.sqrt(ratio), df))
