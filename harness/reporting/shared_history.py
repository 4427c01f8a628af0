"""Two nights judged against one history: the chance that both break the rule.

Why: the nightly's ``regression`` label needs two nights in a row beyond a threshold, and
both nights are tested against the same earlier results, so they share that history's
mean and deviation; breaking on both is far rarer than the square of one. Setting the
per-night level so that the pair breaks at a chosen rate (``verdicts.consecutive_level``)
and stating the move both nights see (``verdicts.consecutive_mdc``) needs that joint
probability, computed here by numerical integration (checked against brute force and an
exact bivariate-normal reference in ``tests/harness/reporting/test_consecutive_nights.py``).
The rule itself (levels, floor, labels) stays in ``verdicts``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import integrate, optimize, stats

__all__ = ["both_beyond", "critical", "persistent_shift"]


def both_beyond(c: float, n: int, shift: float = 0.0, floor: float = -math.inf,
                df: float | None = None) -> float:
    """P(two new results, each moved by ``shift`` noise deviations, both lie beyond ``c``
    on the night-level test's scale against the same ``n`` earlier results, and beyond
    ``floor`` deviations from their mean): the history's mean (normal, deviation
    1/sqrt(n)) by Gauss-Hermite nodes, its deviation (chi with ``df`` degrees of freedom,
    n - 1 where None; more with a prior's: ``moderation``) by adaptive quadrature over
    all but 1e-14 of it at either end; given both, the two results are independent."""
    df, k = (n - 1 if df is None else df), math.sqrt(1 + 1 / n)
    x, w = np.polynomial.hermite_e.hermegauss(60)
    means, w = x / math.sqrt(n), w / w.sum()

    def density(s: float) -> float:
        both = float(np.sum(w * stats.norm.sf(means + max(c * s * k, floor) - shift) ** 2))
        return both * stats.chi.pdf(s * math.sqrt(df), df) * math.sqrt(df)

    low, top = stats.chi.ppf(1e-14, df) / math.sqrt(df), stats.chi.isf(1e-14, df) / math.sqrt(df)
    return integrate.quad(density, low, top, limit=200)[0]


def _widen(holds, x: float) -> float:  # noqa: ANN001 - a predicate, monotone in x
    """A bracket's end for a root search: ``x`` doubled until ``holds`` there (a fixed,
    far end would put the quadrature where the probability it measures is all ~0 or ~1)."""
    for _ in range(64):
        if holds(x):
            return x
        x *= 2
    raise ValueError(f"no bracket up to {x:g}: a rate outside (0, 1)?")


@functools.lru_cache(maxsize=256)
def critical(n: int, alpha: float, df: float | None = None) -> float:
    """The critical t both nights must pass for the pair to break with probability
    ``alpha`` under no change (below zero for an ``alpha`` near 1/4, where even a
    critical value of zero breaks both nights less often)."""
    def excess(c: float) -> float:
        return both_beyond(c, n, df=df) - alpha

    low = 1e-3 if excess(1e-3) > 0 else _widen(lambda c: excess(c) > 0, -1.0)
    return optimize.brentq(excess, low, _widen(lambda c: excess(c) < 0, 10.0))


@functools.lru_cache(maxsize=4096)
def persistent_shift(n: int, alpha: float, power: float, floor: float, df: float
                     ) -> float:
    """The persistent move, in noise deviations, that both nights flag with ``power``,
    the floor (in noise deviations) counted."""
    c = critical(n, alpha, df)

    def seen(d: float) -> float:
        return both_beyond(c, n, d, floor, df)

    return optimize.brentq(lambda d: seen(d) - power, 0.0,
                           _widen(lambda d: seen(d) > power, 10.0))
