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
distribution on ``d0 + d`` degrees of freedom where nothing changed (under the model,
with the prior known; fitted, nearly). Where the cells' variances differ a lot, ``d0``
comes out small and each cell keeps mostly its own; where they agree, ``d0`` is large and
the cell's noise is the metric's. The false-alarm rate stays the one set
(``tests/harness/reporting/test_moderation.py`` checks it and the power against
simulation); what is gained is degrees of freedom, hence power (not for every cell: one
whose repeats happened to agree is pulled up). What it assumes beyond the plain t-test:
that one metric's variances over a comparison's cells are exchangeable (a cell far
noisier than the prior allows keeps its own noise: ``Prior.moderate``), and that
the cells' noise is independent; where it is not (the nights of raw throughput on this
machine move together, one machine-wide shift a night) the cells know little more than
one, and ``d0`` is capped by the cells' effective number (``fit``). Fitted on the log
scale of ``verdicts``, over cells with a non-zero variance.

``Prior`` with ``d0 = 0`` is no moderation (each cell alone): what ``fit`` gives for too
few cells (``MIN_CELLS``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = ["MAX_DF", "MIN_CELLS", "NONE", "OUTLIER", "Prior", "effective_cells", "fit",
           "fit_spreads", "trigamma_inverse"]

MIN_CELLS = 5  # fewer cells with a noise estimate: no prior (each cell judged alone)
OUTLIER = 0.01  # a cell whose variance the prior puts beyond this upper tail keeps its own
MAX_DF = 10_000.0  # an infinite d0 (the variances agree beyond sampling) is capped here
# (and at what the other cells know: ``fit``)


@dataclass(frozen=True)
class Prior:
    d0: float  # the prior's degrees of freedom (0: no prior)
    s0sq: float  # its scale: the typical variance of the metric's logs
    cells: int = 0  # the sample variances it was fitted on
    effective: float = math.nan  # what those cells are worth (``effective_cells``)

    def moderate(self, ss: float, df: float) -> tuple[float, float]:
        """The posterior variance and its degrees of freedom for a cell whose own sum of
        squares is ``ss`` on ``df`` degrees of freedom; its own alone where its variance
        is beyond the prior's upper ``OUTLIER`` tail (the variance over ``s0^2`` is F on
        ``df`` and ``d0`` degrees of freedom under the model): a cell that noisy is not
        one of the cells the prior describes, and pulled toward them it would flag far
        more often than the rate (after Phipson et al. 2016, who give such cells a
        smaller d0)."""
        if self.d0 <= 0 or df < 1 or ss / df > self.s0sq * special.fdtri(df, self.d0, 1 - OUTLIER):
            return (ss / df if df else math.nan), df
        return (self.d0 * self.s0sq + ss) / (self.d0 + df), self.d0 + df

    def moderate_pair(self, deviations: list[float], df: float) -> tuple[float, float]:
        """``moderate`` for a pair of results like one whose repeats deviate by
        ``deviations`` on ``df`` degrees of freedom (``verdicts.spread``): its sum of
        squares taken for both sides, on twice its degrees of freedom (what a comparison
        with a second such result would pool)."""
        return self.moderate(2 * sum(x * x for x in deviations), 2 * df)


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


def effective_cells(deviations: list[list[float]], dfs: list[float]) -> float:
    """How many independent cells the ``G`` cells of ``deviations`` (each cell's deviations
    of the noise, on its ``dfs`` degrees of freedom; entry j of every cell from the same
    repeat round or night) are worth for knowing the noise: Kish's design effect,
    ``G / (1 + (G - 1) r2)``, with ``r2`` the correlation of the cells' variances (for
    normals correlated ``rho``: ``rho^2``), the larger of two estimates from the cosines
    between their deviation vectors: the mean cosine, squared (``rho`` where the cells move
    one way: a machine-wide shift), and the excess of the mean squared cosine over
    independent cells' ``1 / df``, scaled to 1 (either sign; with one degree of freedom
    every cosine is +-1 and only the first tells). Both scatter above zero for independent
    cells, so there the count errs low (the cap errs safe); for cells that share part of
    their noise a sample correlation on few degrees of freedom errs low, so there the count
    errs high (``test_moderation`` bounds by how much). Only vectors of the longest
    length that two or more share take part (a shorter one lost a repeat or a night, and
    its entries no longer line up); with fewer than two, the cells count as one."""
    lengths = [len(v) for v in deviations]
    shared = [n for n in set(lengths) if n and lengths.count(n) >= 2]
    if len(deviations) < 2 or not shared:
        return float(min(len(deviations), 1))
    full = max(shared)
    kept = [i for i, v in enumerate(deviations) if len(v) == full and any(v)]
    if len(kept) < 2:
        return 1.0
    v = np.array([deviations[i] for i in kept], dtype=float)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    df, g, pairs = float(np.median([dfs[i] for i in kept])), len(v), len(v) * (len(v) - 1)
    mean_cos = (float(np.sum(v.sum(axis=0) ** 2)) - g) / pairs  # sum of all cosines, less 1s
    mean_cos2 = (float(np.sum((v.T @ v) ** 2)) - g) / pairs  # sum of squared cosines
    r2 = mean_cos ** 2 if df <= 1 else max(mean_cos ** 2, (mean_cos2 - 1 / df) / (1 - 1 / df))
    r2 = min(1.0, max(r2, 0.0))
    return len(deviations) / (1 + (len(deviations) - 1) * r2)


def fit_spreads(spreads: list[tuple[list[float], float]], cell_df: float | None = None
                ) -> Prior:
    """``fit`` on each cell's deviations and their degrees of freedom (``verdicts.spread``'s):
    the variances and the correlation both come from them."""
    return fit([(sum(x * x for x in r) / df, df) for r, df in spreads],
               [r for r, _ in spreads], cell_df)


def fit(variances: list[tuple[float, float]], deviations: list[list[float]] | None = None,
        cell_df: float | None = None) -> Prior:
    """The prior (``d0``, ``s0^2``) of one metric from its cells' (sample variance, degrees
    of freedom): the logs' mean and variance matched to those of a scaled F distribution
    (Smyth 2004, section 6.2); cells with no degree of freedom or a zero variance left out;
    ``NONE`` for fewer than ``MIN_CELLS``. ``d0`` is at most what the other cells know:
    their degrees of freedom together, counted as ``effective_cells`` of ``deviations``
    (the cells' aligned deviations, one per variance; None: independent cells). Where the
    cells' noise moves together (a machine-wide shift on a night, a slow repeat round)
    they know little more than one cell does, and limma's d0 would make each cell's t
    look like one on many degrees of freedom while it is one on few: at 1e-4 a metric,
    flags on every cell at once. ``cell_df``: each other cell's degrees of freedom in the
    comparison the prior is for, where that is not the fitted variances' (None: their
    mean)."""
    keep = [i for i, (s2, d) in enumerate(variances) if d >= 1 and s2 > 0 and math.isfinite(s2)]
    if len(keep) < MIN_CELLS:
        return NONE
    s2 = np.array([variances[i][0] for i in keep])
    d = np.array([float(variances[i][1]) for i in keep])
    cells = len(keep) if deviations is None else effective_cells(
        [deviations[i] for i in keep], list(d))
    cap = min(max(cells - 1, 0.0) * (cell_df or float(d.mean())), MAX_DF)
    e = np.log(s2) - special.digamma(d / 2) + np.log(d / 2)
    mean = float(e.mean())
    excess = float(e.var(ddof=1) - special.polygamma(1, d / 2).mean())
    if excess <= 0:  # no more scatter than sampling makes: one variance for all
        return Prior(cap, math.exp(mean), len(keep), cells)
    d0 = 2 * trigamma_inverse(excess)  # the scale from the fitted d0, then d0 capped
    return Prior(min(d0, cap), math.exp(mean + special.digamma(d0 / 2) - math.log(d0 / 2)),
                 len(keep), cells)
