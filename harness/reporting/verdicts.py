"""Verdicts with a known error rate: did a cell's metric move, and what could we have seen?

Why: the old rule ("the medians moved by more than the two spreads added") had no error
rate: on one commit it flagged 23 regressions in a pair of smoke runs, and on noisy cells
its threshold widened to 50-100%, so a real 30% slowdown passed. A verdict is worth what
its false-alarm rate and its power are worth, so both are set here and stated.

The rule (one metric of one cell; the values are its repeats, higher or lower better):
- Work on logarithms: a relative change is a shift, and noise on this machine is roughly
  multiplicative.
- Against one or two baseline results (a pair, A/A or before/after): a one-sided
  two-sample t-test of the repeats' logs, the deviation pooled with each result's repeats
  about their own mean: ``t = (mean_c - mean_b) / (s * sqrt(1/n_b + 1/n_c))``.
- Against a history of ``HISTORY_RESULTS`` or more results (the nightly): each result is
  one value, its mean log, because results differ by more than their repeats do (the
  machine drifts between nights); the current result is tested against the prediction
  interval of the earlier ones: ``t = (m_c - mean(m)) / (s_m * sqrt(1 + 1/N))`` with
  N - 1 degrees of freedom (exact for normal noise: this is where drift counts).
- Pair mode's rate is its ``alpha`` where a result's repeats carry all of its noise; results
  run hours apart vary more than that (``between`` measures by how much from an A/A
  series, and ``between.pair_rate`` gives the rate of a pair test against one baseline
  at the measured ratio).
- Either way each metric is tested at a false-alarm rate ``alpha`` (one-sided; for the two
  nights of the over-nights label, the pair's rate: below); beyond the critical value in
  the bad direction is ``regression``, in the good one ``improvement``, else
  ``within-noise``; no degree of freedom is ``too-few-repeats``.
- The rate is set per comparison, not per metric (``SUITE_ALPHA``, ``per_metric``): a
  night judges every noisy metric of every cell (the nightly several hundred), and at a
  fixed rate per metric a comparison in which nothing changed flags about ``m x alpha``
  of them (at 0.001 a metric, 480 independent metrics would flag a regression on
  1 - 0.999^480 = 38% of unchanged nights where the noise model holds). So a
  comparison's ``m`` judged metrics are each tested at ``SUITE_ALPHA / m`` (Bonferroni;
  it holds whatever the metrics' dependence), and, where the noise model holds, the
  chance that a comparison of unchanged code flags any regression is at most
  ``SUITE_ALPHA`` (and as much for improvements; where results vary more than their
  repeats say, pair mode flags more: ``between``). The price is power: a cell's MDC is
  stated at the level its comparison tests it at, so the same noise sees less in a
  suite of many metrics than in one of few. Benjamini-Hochberg would keep more power for
  a change that moves many cells at once (a regression of our runtime does), with the
  same rate where nothing changed, but a cell's MDC would then depend on the other cells'
  moves; not taken. ``ALPHA`` is the level of the functions below where a caller gives
  none.
- A move smaller than ``MIN_CHANGE`` (as a log ratio, ``log(1 + MIN_CHANGE)`` either way)
  is never flagged, however small the noise: a figure that barely varies (peak memory, a
  near-deterministic bubble) would otherwise flag its allocator's wobble (re-judged over
  nights, the smoke A/A runs at 2750c3b labelled a 0.3% peak-memory move an improvement).
  The floor only lowers the false-alarm rate, and is far below ``TARGET_MDC``; where it
  binds, the MDC is the floor plus ``t_{POWER,df}`` standard errors.
- Minimum detectable change (MDC): the smallest relative change this cell would flag
  with probability ``POWER`` at its level ``alpha``, from its own measured noise:
  ``exp((t_{1-alpha,df} + t_{POWER,df}) * se) - 1``. A cell whose MDC exceeds
  ``TARGET_MDC`` says so: it cannot see a 10% regression, and ``repeats_for`` says how many
  repeats a side a pair of results of its noise would need to see it.
- A cell's error bar: the ``INTERVAL`` confidence interval of its repeats' geometric mean
  (``interval``), logged to MLflow beside the median.
- Time to target over seeds (``faster``): a one-sided Welch t-test on the logs that one
  system reaches the target in less time than another, at ``TTA_ALPHA`` (one claim, not a
  night's hundreds of metrics).
  Its interval of the ratio of geometric means also judges ``bench``'s throughput goals
  (``harness.experiments.bench.checks``).
- Over nights (PyTorch's benchmark HUD): a ``regression`` needs two consecutive nights
  beyond the two nights' threshold in the same direction; tonight alone beyond the one
  night's threshold is ``suspicious``; fewer than ``MIN_HISTORY`` earlier results is
  ``insufficient data``.
- The two nights' rate, set rather than compounded: both nights are tested against the
  same ``n`` earlier results (the night-level test), so they share that history's mean and
  deviation, and breaking on both is far rarer than on one. Testing each night at the
  level ``alpha`` made the label's false-alarm rate much lower than ``alpha`` and its
  power much lower than it need be. So from ``HISTORY_RESULTS`` results on, each of the
  two nights is tested at ``consecutive_level(n, alpha)``: the rate at which both break
  the same way with probability ``alpha`` (exactly for normal noise without the
  ``MIN_CHANGE`` floor, which only removes breaks; the shared history integrated out
  numerically: over its mean, normal, and its deviation, chi). ``suspicious`` still needs
  tonight beyond the ``alpha`` threshold, so neither label fires more often than
  ``alpha``. The label's MDC (``consecutive_mdc``) is the persistent move seen on both
  nights with probability ``POWER``, the floor counted. With fewer results (repeats
  against repeats) each night is tested at ``alpha``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import integrate, optimize, stats

__all__ = ["ALPHA", "BROKEN", "DRIFT_LEVEL", "HISTORY_RESULTS", "INTERVAL", "MIN_CHANGE",
           "MIN_HISTORY", "ONE_NIGHT", "POWER", "SUITE_ALPHA", "TARGET_MDC", "TTA_ALPHA",
           "Faster", "Test",
           "centred", "consecutive_level", "consecutive_mdc", "faster", "interval",
           "log_values", "mdc", "moved",
           "night_label", "noise", "per_metric", "repeats_for", "rule_text", "test"]

ALPHA = 0.001  # the level per metric where a caller gives none; reports give per_metric's
SUITE_ALPHA = 0.05  # false alarms per comparison of suite results, one-sided: the chance
# that any of its judged metrics flags a regression where nothing changed (the
# conventional family-wise level), split over them (``per_metric``)
POWER = 0.9  # the probability at which the minimum detectable change is stated
TARGET_MDC = 0.10  # what every throughput cell should be able to see
MIN_CHANGE = 0.02  # no move smaller than this is flagged, whatever the noise
MIN_HISTORY = 2  # earlier results needed for a verdict over nights
BROKEN = ("regression", "improvement")  # the verdicts that break the rule: flags
ONE_NIGHT = ("suspicious", "improvement (one night)")  # the labels of a night alone
HISTORY_RESULTS = 3  # from this many baseline results on, results (not repeats) are units
TTA_ALPHA = 0.05  # one claim per pair of systems ("a reaches the target faster"), not
# hundreds of metrics a night: the conventional one-sided level
INTERVAL = 0.95  # the confidence of a cell's interval (its error bar in MLflow and reports)
# a cell's drift reference "moved" between baseline and current where a two-sided test of
# its logs breaks at this level; the drift-cancelled figure is then judged (regressions)
DRIFT_LEVEL = 0.05


def per_metric(judged: int, rate: float = SUITE_ALPHA) -> float:
    """The level each of a comparison's ``judged`` metrics is tested at, so that the
    comparison flags falsely at ``rate`` at most: ``rate / judged`` (Bonferroni)."""
    return rate / max(1, judged)


def rule_text(rate: float = SUITE_ALPHA, judged: int | None = None) -> str:
    """The rule in one sentence, for reports (its numbers read from the code); ``judged``:
    the comparison's judged metrics, where there is one comparison to state."""
    each = ("" if judged is None else "; none judged here" if judged == 0 else
            f"; {judged} judged here: {per_metric(judged, rate):.2g} each")
    return (f"one-sided t-test on log values at a false-alarm rate of {rate:g} per "
            f"comparison, split equally over its judged metrics (Bonferroni{each}): "
            f"repeats against repeats for one or two baseline results, the result against "
            f"the prediction interval of {HISTORY_RESULTS} or more earlier results; MDC = "
            f"the smallest change detected with {POWER:.0%} probability, from each cell's "
            f"own noise; no move under {MIN_CHANGE:.0%} is flagged; of throughput and CPU "
            f"time per sample, each raw and drift-cancelled, the drift-cancelled one where "
            f"the cell's drift reference moved (two-sided, at {DRIFT_LEVEL:g}), else the "
            f"one whose baseline was stabler")


@dataclass(frozen=True)
class Test:
    change: float  # relative change of the geometric means, current / baseline - 1
    t: float  # the statistic (signed: positive = current higher)
    critical: float  # |t| beyond this breaks the rule (at the rate it was tested at)
    sd: float  # pooled standard deviation of the logs (the cell's noise)
    df: int
    mdc: float  # minimum detectable relative change at POWER (two nights': consecutive)
    verdict: str  # regression | improvement | within-noise | too-few-repeats
    flag_at: float = math.nan  # the relative move at the critical value
    two_nights: bool = False  # tested as one of two nights (consecutive; mdc: the pair's)

    @property
    def broke(self) -> bool:
        return self.verdict in BROKEN


def log_values(values) -> list[float]:  # noqa: ANN001 - numbers
    """The logs of ``values`` that have one (positive and finite): the rule's scale."""
    return [math.log(v) for v in values if v is not None and v > 0 and math.isfinite(v)]


def centred(groups: list[list[float]]) -> tuple[float, int]:
    """Sum of squares about each group's mean, and its degrees of freedom."""
    ss, df = 0.0, 0
    for g in groups:
        if len(g) > 1:
            m = sum(g) / len(g)
            ss += sum((x - m) ** 2 for x in g)
            df += len(g) - 1
    return ss, df


def mdc(sd: float, n_base: int, n_cur: int, df: int, alpha: float = ALPHA,
        power: float = POWER) -> float:
    """The smallest relative change flagged with probability ``power`` (normal-noise
    approximation to the noncentral t)."""
    if df < 1 or not math.isfinite(sd):
        return math.inf
    return _detectable(sd * math.sqrt(1 / n_base + 1 / n_cur), df, alpha, power)


def _flag_at(se: float, df: int, alpha: float) -> float:
    """The relative move the rule flags at: the critical value, or the floor if larger."""
    return math.exp(max(stats.t.ppf(1 - alpha, df) * se, math.log1p(MIN_CHANGE))) - 1


def _detectable(se: float, df: int, alpha: float, power: float) -> float:
    """The true move seen with probability ``power``: ``t_{power}`` standard errors beyond
    the point the rule flags at."""
    return (1 + _flag_at(se, df, alpha)) * math.exp(stats.t.ppf(power, df) * se) - 1


def repeats_for(sd: float, target: float = TARGET_MDC, alpha: float = ALPHA,
                most: int = 1000) -> int | None:
    """The fewest repeats a side (two results of ``n`` repeats each, the pair test above)
    at which noise ``sd`` (deviation of the logs) has an MDC of at most ``target``; None
    beyond ``most`` or without a finite ``sd``."""
    if not math.isfinite(sd):
        return None
    for n in range(2, most + 1):  # the MDC falls as n grows: the first n that reaches it
        if mdc(sd, n, n, 2 * n - 2, alpha) <= target:
            return n
    return None


def test(baseline: list[list[float]], current: list[float], higher_is_better: bool = True,
         alpha: float = ALPHA, consecutive: bool = False) -> Test:
    """The rule above: ``baseline`` is one list of repeats per earlier result (oldest
    first); from ``HISTORY_RESULTS`` results on, the night-level test. ``consecutive``:
    this is one of two nights judged together against the same results (the over-nights
    label): from ``HISTORY_RESULTS`` results on, tested at ``consecutive_level`` and with
    the two nights' MDC; with fewer, as a single comparison."""
    base = [g for g in (log_values(g) for g in baseline) if g]
    cur = log_values(current)
    if not base or not cur:
        return _too_few(math.nan)
    mean_c = sum(cur) / len(cur)
    nights = len(base) if consecutive and len(base) >= HISTORY_RESULTS else 0
    # each of two nights at the level that makes the pair's rate alpha
    level = consecutive_level(nights, alpha) if nights else alpha
    if len(base) >= HISTORY_RESULTS:  # each result one value: its mean
        means = [sum(g) / len(g) for g in base]
        n = len(means)
        centre = sum(means) / n
        ss, df = centred([means])
        factor = math.sqrt(1 + 1 / n)  # a prediction interval for one more result
        n_b, n_c = n, 1
    else:  # repeats against repeats, each result's repeats about their own mean
        n_b, n_c = sum(len(g) for g in base), len(cur)
        centre = sum(x for g in base for x in g) / n_b
        ss, df = centred([*base, cur])
        factor = math.sqrt(1 / n_b + 1 / n_c)
    change = math.exp(mean_c - centre) - 1
    if df < 1:
        return _too_few(change)
    sd = math.sqrt(ss / df)
    se = sd * factor
    diff = mean_c - centre
    t = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    critical = float(stats.t.ppf(1 - level, df))
    big = abs(diff) >= math.log1p(MIN_CHANGE)  # the floor, symmetric in the logs
    worse = big and (t < -critical if higher_is_better else t > critical)
    better = big and (t > critical if higher_is_better else t < -critical)
    verdict = "regression" if worse else "improvement" if better else "within-noise"
    seen = consecutive_mdc(sd, nights, alpha) if nights else _detectable(se, df, alpha, POWER)
    return Test(change, t, critical, sd, df, seen, verdict, _flag_at(se, df, level),
                bool(nights))


def moved(baseline: list[list[float]], current: list[float],
          level: float = DRIFT_LEVEL) -> bool:
    """Whether ``current`` moved from ``baseline`` either way: ``test``'s statistic beyond
    its two-sided critical value at ``level`` (no floor: a figure that is not judged, the
    drift reference, is only asked whether it moved)."""
    r = test(baseline, current, True, level / 2)
    return r.df >= 1 and abs(r.t) > r.critical


def noise(baseline: list[list[float]]) -> float:
    """The baseline's own noise as ``test`` would measure it (the deviation of the logs:
    of the results' means from a history on, else of the repeats about each result's
    mean); NaN where it has no degree of freedom. Which of two figures to judge is decided
    on this, from the baseline alone, so that the choice does not look at the current
    result."""
    base = [g for g in (log_values(g) for g in baseline) if g]
    if len(base) >= HISTORY_RESULTS:
        ss, df = centred([[sum(g) / len(g) for g in base]])
    else:
        ss, df = centred(base)
    return math.sqrt(ss / df) if df else math.nan


def interval(values, level: float = INTERVAL) -> tuple[float, float]:  # noqa: ANN001
    """A ``level`` confidence interval of the geometric mean of ``values`` (a t interval on
    the logs, the noise model of ``test``); NaNs under two values."""
    logs = log_values(values)
    if len(logs) < 2:
        return math.nan, math.nan
    ss, df = centred([logs])
    m = sum(logs) / len(logs)
    half = stats.t.ppf(0.5 + level / 2, df) * math.sqrt(ss / df / len(logs))
    return math.exp(m - half), math.exp(m + half)


@dataclass(frozen=True)
class Faster:
    ratio: float  # geometric mean of a / of b (below 1: a is faster)
    low: float  # the ratio's INTERVAL confidence interval
    high: float
    p: float  # one-sided: the chance of a ratio this low if a were not faster
    shown: bool  # p < alpha


def faster(a, b, alpha: float = TTA_ALPHA) -> Faster:  # noqa: ANN001 - numbers
    """Is ``a`` (e.g. one system's times to target over seeds) lower than ``b``? A
    one-sided Welch t-test on the logs (MLPerf judges convergence over seeds, one-sided);
    NaNs with fewer than two values on a side."""
    la, lb = log_values(a), log_values(b)
    if len(la) < 2 or len(lb) < 2:
        return Faster(math.nan, math.nan, math.nan, math.nan, False)
    r = stats.ttest_ind(la, lb, equal_var=False, alternative="less")
    ci = stats.ttest_ind(la, lb, equal_var=False).confidence_interval(INTERVAL)
    d = sum(la) / len(la) - sum(lb) / len(lb)
    p = float(r.pvalue)
    return Faster(math.exp(d), math.exp(ci.low), math.exp(ci.high), p, p < alpha)


def _too_few(change: float) -> Test:
    return Test(change, math.nan, math.nan, math.nan, 0, math.inf, "too-few-repeats")


def night_label(nights: list[str], history: int, strict: str | None = None) -> str:
    """The verdict over nights for the newest night: ``nights`` oldest first, each night's
    ``Test.verdict`` against the same earlier results at the two nights' level
    (``consecutive_level``); ``strict``: the newest night's verdict at ``alpha`` (None: the
    same as ``nights[-1]``, where both levels are one); ``history``: earlier results the
    newest had."""
    strict = nights[-1] if strict is None and nights else strict
    if history < MIN_HISTORY or not nights or nights[-1] == "too-few-repeats":
        return "insufficient data"
    last = nights[-1]
    if last in BROKEN and len(nights) > 1 and nights[-2] == last:
        return last  # two consecutive nights beyond the threshold, same way
    if strict not in BROKEN:
        return "ok"
    return ONE_NIGHT[0] if strict == "regression" else ONE_NIGHT[1]


def _both_beyond(c: float, n: int, shift: float = 0.0, floor: float = -math.inf) -> float:
    """P(two new results, each moved by ``shift`` noise deviations, both lie beyond ``c``
    on the night-level test's scale against the same ``n`` earlier results, and beyond
    ``floor`` deviations from their mean): the history's mean (normal, deviation
    1/sqrt(n)) by Gauss-Hermite nodes, its deviation (chi with n - 1 degrees of freedom)
    by adaptive quadrature; given both, the two results are independent."""
    df, k = n - 1, math.sqrt(1 + 1 / n)
    x, w = np.polynomial.hermite_e.hermegauss(60)
    means, w = x / math.sqrt(n), w / w.sum()

    def density(s: float) -> float:
        both = float(np.sum(w * stats.norm.sf(means + max(c * s * k, floor) - shift) ** 2))
        return both * stats.chi.pdf(s * math.sqrt(df), df) * math.sqrt(df)

    top = stats.chi.isf(1e-14, df) / math.sqrt(df)  # beyond it: nothing that counts
    return integrate.quad(density, 0, top, limit=200)[0]


def _widen(holds, x: float) -> float:  # noqa: ANN001 - a predicate, monotone in x
    """A bracket's end for a root search: ``x`` doubled until ``holds`` there (a fixed,
    far end would put the quadrature where the probability it measures is all ~0 or ~1)."""
    for _ in range(64):
        if holds(x):
            return x
        x *= 2
    raise ValueError(f"no bracket up to {x:g}: a rate outside (0, 1)?")


@functools.lru_cache(maxsize=256)
def _consecutive_critical(n: int, alpha: float) -> float:
    """The critical t both nights must pass for the pair to break with probability
    ``alpha`` under no change (below zero for an ``alpha`` near 1/4, where even a
    critical value of zero breaks both nights less often)."""
    def excess(c: float) -> float:
        return _both_beyond(c, n) - alpha

    low = 1e-3 if excess(1e-3) > 0 else _widen(lambda c: excess(c) > 0, -1.0)
    return optimize.brentq(excess, low, _widen(lambda c: excess(c) < 0, 10.0))


def consecutive_level(n: int, alpha: float = ALPHA) -> float:
    """The one-sided rate per night at which two nights tested against the same ``n``
    earlier results (``n >= HISTORY_RESULTS``: each result one value) both break the rule
    the same way with probability ``alpha`` (at most ``alpha`` with the ``MIN_CHANGE``
    floor, which only removes breaks)."""
    return float(stats.t.sf(_consecutive_critical(n, alpha), n - 1))


@functools.lru_cache(maxsize=4096)
def _consecutive_shift(n: int, alpha: float, power: float, floor: float) -> float:
    """The persistent move, in noise deviations, that both nights flag with ``power``,
    the floor (in noise deviations) counted."""
    c = _consecutive_critical(n, alpha)
    return optimize.brentq(lambda d: _both_beyond(c, n, d, floor) - power, 0.0,
                           _widen(lambda d: _both_beyond(c, n, d, floor) > power, 10.0))


def consecutive_mdc(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest relative move lasting two nights that the two-night label flags with
    probability ``power``, for night-level noise ``sd`` (the deviation of the results'
    mean logs) and ``n`` earlier results; the ``MIN_CHANGE`` floor is counted inside the
    probability (each night must pass both it and the critical value), in noise
    deviations to three figures (one computation serves many cells)."""
    if n < HISTORY_RESULTS or not math.isfinite(sd):
        return math.inf
    if sd <= 0:
        return MIN_CHANGE
    floor = float(f"{math.log1p(MIN_CHANGE) / sd:.3g}")
    lowest = stats.chi.ppf(1e-9, n - 1) / math.sqrt(n - 1)  # the smallest s that counts
    if floor <= _consecutive_critical(n, alpha) * lowest * math.sqrt(1 + 1 / n):
        floor = -math.inf  # the critical value is beyond the floor wherever it matters
    return math.expm1(_consecutive_shift(n, alpha, power, floor) * sd)
