"""Borrowing noise across cells: empirical-Bayes moderated variances (Smyth 2004, limma).

Why: a cell of the nightly has three repeats, so its own noise estimate has few degrees
of freedom (a pair of results: 4), and at the level a comparison of hundreds of metrics
tests each at (``verdicts.per_metric``: about 1e-4) the t distribution's critical value
on 4 degrees of freedom is 13: a noise of 10% could then only see moves of a few hundred
percent. Much of that is the estimate's own uncertainty, not the cell's noise: the
sample variances of one metric across a suite's cells scatter mostly as a chi-square on
4 degrees of freedom would. The same metric's other cells say what a cell's noise is
likely to be.

The model (the one limma uses for thousands of genes with a few replicates each): each
cell's true variance of a metric is drawn from a scaled inverse chi-square with ``d0``
degrees of freedom and scale ``s0^2`` (one prior per metric and comparison, fitted to
that metric's sample variances over the comparison's cells by the method of moments on
their logs: ``fit``), and each cell's sample variance is its true variance times a
chi-square on its ``d`` degrees of freedom over ``d``. Then the posterior variance

    s~^2 = (d0 s0^2 + d s^2) / (d0 + d)

stands in for ``s^2``, and the t statistic with ``s~`` in place of ``s`` follows a t
distribution on ``d0 + d`` degrees of freedom where nothing changed (exactly, under the
model). Where the cells' variances differ a lot, ``d0`` comes out small and each cell
keeps mostly its own; where they agree, ``d0`` is large and the cell's noise is the
metric's. The false-alarm rate stays the one set (``tests/harness/reporting/
test_moderation.py`` checks it and the power against simulation); what is gained is
degrees of freedom, hence power. What it assumes beyond the plain t-test: that one
metric's variances over the cells of a comparison are exchangeable (a very noisy cell
among quiet ones is pulled toward them and flags more often than the rate says); it is
fitted on the log scale of ``verdicts`` and only over cells with a non-zero variance.

``Prior`` with ``d0 = 0`` is no moderation (each cell alone): what ``fit`` gives for too
few cells (``MIN_CELLS``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = ["MAX_DF", "MIN_CELLS", "NONE", "Prior", "fit", "trigamma_inverse"]

MIN_CELLS = 5  # fewer cells with a noise estimate: no prior (each cell judged alone)
MAX_DF = 10_000.0  # an infinite d0 (the variances agree beyond sampling) is capped here
# (and at the cells' degrees of freedom together: ``fit``)


@dataclass(frozen=True)
class Prior:
    d0: float  # the prior's degrees of freedom (0: no prior)
    s0sq: float  # its scale: the typical variance of the metric's logs
    cells: int = 0  # the sample variances it was fitted on

    def moderate(self, ss: float, df: float) -> tuple[float, float]:
        """The posterior variance and its degrees of freedom for a cell whose own sum of
        squares is ``ss`` on ``df`` degrees of freedom."""
        if self.d0 <= 0 or df < 1:
            return (ss / df if df else math.nan), df
        return (self.d0 * self.s0sq + ss) / (self.d0 + df), self.d0 + df


NONE = Prior(0.0, math.nan)


def trigamma_inverse(x: float) -> float:
    """The ``y`` with trigamma(y) = ``x`` (x > 0), by Smyth's Newton iteration (on 1 /
    trigamma, which is nearly linear in y)."""
    if x > 1e7:
        return 1 / math.sqrt(x)
    if x < 1e-6:
        return 1 / x
    y = 0.5 + 1 / x
    for _ in range(100):
        tri = float(special.polygamma(1, y))
        step = tri * (1 - tri / x) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            return y
    raise ArithmeticError(f"trigamma_inverse({x:g}) did not converge")


def fit(variances: list[tuple[float, float]]) -> Prior:
    """The prior (``d0``, ``s0^2``) of one metric from its cells' (sample variance, degrees
    of freedom): the logs' mean and variance matched to those of a scaled F distribution
    (Smyth 2004, section 6.2); cells with no degree of freedom or a zero variance left out;
    ``NONE`` for fewer than ``MIN_CELLS``. ``d0`` is at most the cells' degrees of freedom
    together: where all share one variance, its estimate from all of them has that many
    (limma would take it as known, and at 1e-4 a metric flag up to half as often again
    as the rate says)."""
    kept = [(s2, d) for s2, d in variances if d >= 1 and s2 > 0 and math.isfinite(s2)]
    if len(kept) < MIN_CELLS:
        return NONE
    s2 = np.array([v for v, _ in kept])
    d = np.array([float(k) for _, k in kept])
    e = np.log(s2) - special.digamma(d / 2) + np.log(d / 2)
    mean = float(e.mean())
    excess = float(e.var(ddof=1) - special.polygamma(1, d / 2).mean())
    pooled = float(d.sum())  # the prior is known no better than from all cells together
    if excess <= 0:  # no more scatter than sampling makes: one variance for all
        return Prior(min(pooled, MAX_DF), math.exp(mean), len(kept))
    d0 = min(2 * trigamma_inverse(excess), pooled, MAX_DF)
    return Prior(d0, math.exp(mean + special.digamma(d0 / 2) - math.log(d0 / 2)), len(kept))
