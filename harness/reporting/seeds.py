"""Is one system faster than another? One claim, judged over seeds or repeats.

Why: "2BW reaches the target as fast as PipeDream-Flush" and bench's goals ("our gpipe at
least 0.95x torch's") are statistical claims about one pair of systems, not a night's
hundreds of metrics, so they are tested at the conventional one-sided level rather than
the nightly's per-metric one (``verdicts``): a one-sided Welch t-test on the logs (MLPerf
judges convergence over seeds, one-sided), with the interval of the ratio of geometric
means (which judges ``harness.experiments.bench.checks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from harness.reporting.verdicts import INTERVAL, log_values

__all__ = ["TTA_ALPHA", "Faster", "faster"]

TTA_ALPHA = 0.05  # one claim per pair of systems ("a reaches the target faster"), not
# hundreds of metrics a night: the conventional one-sided level


@dataclass(frozen=True)
class Faster:
    ratio: float  # geometric mean of a / of b (below 1: a is faster)
    low: float  # the ratio's INTERVAL confidence interval
    high: float
    p: float  # one-sided: the chance of a ratio this low if a were not faster
    shown: bool  # p < alpha


def faster(a, b, alpha: float = TTA_ALPHA) -> Faster:  # noqa: ANN001 - numbers
    """Is ``a`` (e.g. one system's times to target over seeds) lower than ``b``? A
    one-sided Welch t-test on the logs; NaNs with fewer than two values on a side."""
    la, lb = log_values(a), log_values(b)
    if len(la) < 2 or len(lb) < 2:
        return Faster(math.nan, math.nan, math.nan, math.nan, False)
    r = stats.ttest_ind(la, lb, equal_var=False, alternative="less")
    ci = stats.ttest_ind(la, lb, equal_var=False).confidence_interval(INTERVAL)
    d = sum(la) / len(la) - sum(lb) / len(lb)
    p = float(r.pvalue)
    return Faster(math.exp(d), math.exp(ci.low), math.exp(ci.high), p, p < alpha)
