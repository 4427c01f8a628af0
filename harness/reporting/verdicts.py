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
- Either way, given a ``moderation.Prior`` (the reports fit one per metric over a
  comparison's cells), ``s^2`` is the cell's own variance moderated toward the metric's
  over the cells, on ``d0`` more degrees of freedom (in either mode): the same rate, more
  power for most cells (``moderation`` says which lose and when the cells count as few).
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
  suite of many metrics than in one of few. Benjamini-Hochberg would keep more power
  for a change that moves many cells at once, but a cell's MDC would then depend on the
  other cells' moves; not taken. ``ALPHA``: the level where a caller gives none.
- A move smaller than ``MIN_CHANGE`` (as a log ratio, ``log(1 + MIN_CHANGE)`` either way)
  is never flagged, however small the noise: a figure that barely varies (peak memory, a
  near-deterministic bubble) would otherwise flag its allocator's wobble (re-judged over
  nights, the smoke A/A runs at 2750c3b labelled a 0.3% peak-memory move an improvement).
  The floor only lowers the false-alarm rate, and is far below ``TARGET_MDC``; where it
  binds, the MDC is the floor plus ``t_{POWER,df}`` standard errors.
- Minimum detectable change (MDC): the smallest relative change this cell would flag
  with probability ``POWER`` at its level ``alpha``, from its measured noise (moderated):
  ``exp((t_{1-alpha,df} + t_{POWER,df}) * se) - 1``. A cell whose MDC exceeds
  ``TARGET_MDC`` says so: it cannot see a 10% regression, and ``repeats_for`` says how many
  repeats a side a pair of results of its noise would need to see it.
- A cell's error bar: the ``INTERVAL`` confidence interval of its repeats' geometric mean
  (``interval``), logged to MLflow beside the median. Over seeds: ``seeds.faster``.
- Over nights (PyTorch's benchmark HUD): a ``regression`` needs two consecutive nights
  beyond the two nights' threshold in the same direction; tonight alone beyond the one
  night's threshold is ``suspicious``; fewer than ``MIN_HISTORY`` earlier results is
  ``insufficient data``.
- The two nights' rate, set rather than compounded: both nights are tested against the
  same ``n`` earlier results (the night-level test), so they share that history's mean and
  deviation, and breaking on both is far rarer than on one. Testing each night at the
  level ``alpha`` wasted power. So from ``HISTORY_RESULTS`` results on, each night is
  tested at ``consecutive_level(n, alpha)``: the rate at which both break the same way
  with probability ``alpha`` (exact for normal noise without the ``MIN_CHANGE`` floor,
  which only removes breaks; the shared history integrated out: ``shared_history``).
  ``suspicious`` still needs tonight beyond the ``alpha`` threshold, so neither label
  fires more often than ``alpha``. The label's MDC (``consecutive_mdc``): the persistent
  move seen on both nights with probability ``POWER``, the floor counted. With fewer
  results (repeats against repeats) each night is tested at ``alpha``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import special, stats

from harness.reporting import moderation, shared_history

__all__ = ["ALPHA", "BROKEN", "DRIFT_LEVEL", "HISTORY_RESULTS", "INTERVAL", "MIN_CHANGE",
           "MIN_HISTORY", "NIGHTLY_WINDOW", "ONE_NIGHT", "POWER", "SUITE_ALPHA", "TARGET_MDC",
           "Test",
           "by_results", "centred", "consecutive_level", "consecutive_mdc", "interval",
           "log_values", "mdc", "moved",
           "night_label", "noise", "per_metric", "repeats_for", "residuals", "rule_text",
           "spread", "t_ppf", "t_sf", "test"]

ALPHA = 0.001  # the level per metric where a caller gives none; reports give per_metric's
SUITE_ALPHA = 0.05  # false alarms per comparison of suite results, one-sided: the chance
# that any of its judged metrics flags a regression where nothing changed (the
# conventional family-wise level), split over them (``per_metric``)
POWER = 0.9  # the probability at which the minimum detectable change is stated
TARGET_MDC = 0.10  # what every throughput cell should be able to see
MIN_CHANGE = 0.02  # no move smaller than this is flagged, whatever the noise
MIN_HISTORY = 2  # earlier results needed for a verdict over nights
NIGHTLY_WINDOW = 5  # the earlier nights `make nightly` judges a night against (--history)
BROKEN = ("regression", "improvement")  # the verdicts that break the rule: flags
ONE_NIGHT = ("suspicious", "improvement (one night)")  # the labels of a night alone
HISTORY_RESULTS = 3  # from this many baseline results on, results (not repeats) are units
INTERVAL = 0.95  # the confidence of a cell's interval (its error bar in MLflow and reports)
DRIFT_LEVEL = 0.05  # a cell's drift reference "moved" (two-sided; regressions.reference_moved)


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
            f"the prediction interval of {HISTORY_RESULTS} or more earlier results; each "
            f"cell's noise moderated by the same metric's over the comparison's cells "
            f"(empirical Bayes, from {moderation.MIN_CELLS} cells); MDC = the smallest "
            f"change detected with {POWER:.0%} probability, from that noise; no move under "
            f"{MIN_CHANGE:.0%} is flagged; of throughput and CPU "
            f"time per sample, each raw and drift-cancelled, the drift-cancelled one where "
            f"the cell's drift reference moved (two-sided, at {DRIFT_LEVEL:g}), else the "
            f"one whose baseline was stabler")


@dataclass(frozen=True)
class Test:
    change: float  # relative change of the geometric means, current / baseline - 1
    t: float  # the statistic (signed: positive = current higher)
    critical: float  # |t| beyond this breaks the rule (at the rate it was tested at)
    sd: float  # pooled standard deviation of the logs (the cell's noise)
    df: float  # its degrees of freedom (with a prior's: moderation)
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


def residuals(groups: list[list[float]]) -> tuple[list[float], int]:
    """Each value's deviation from its group's mean (groups of one left out), and their
    degrees of freedom."""
    out, df = [], 0
    for g in groups:
        if len(g) > 1:
            m = sum(g) / len(g)
            out += [x - m for x in g]
            df += len(g) - 1
    return out, df


def centred(groups: list[list[float]]) -> tuple[float, int]:
    """Sum of squares about each group's mean, and its degrees of freedom."""
    r, df = residuals(groups)
    return sum(x * x for x in r), df


def t_ppf(q: float, df: float) -> float:
    """Student's t quantile, as ``scipy.stats.t.ppf(q, df)`` gives it: the same
    ``special.stdtrit`` that its ``_ppf`` calls, without the argument checks and
    broadcasting that cost that call some 70 times as much (the rule asks for thousands
    of quantiles per report, and the tests that measure its error rates for millions)."""
    if q <= 0.0:  # the ends as stats gives them (the bare ufunc's q = 0 is +inf)
        return -math.inf
    if q >= 1.0:
        return math.inf
    return float(special.stdtrit(df, q))


def t_sf(x: float, df: float) -> float:
    """Student's t survival function, as ``scipy.stats.t.sf(x, df)`` (its ``_sf``)."""
    return float(special.stdtr(df, -x))


def mdc(sd: float, n_base: int, n_cur: int, df: float, alpha: float = ALPHA,
        power: float = POWER) -> float:
    """The smallest relative change flagged with probability ``power`` (normal-noise
    approximation to the noncentral t)."""
    if df < 1 or not math.isfinite(sd):
        return math.inf
    return _detectable(sd * math.sqrt(1 / n_base + 1 / n_cur), df, alpha, power)


def _flag_at(se: float, df: float, alpha: float) -> float:
    """The relative move the rule flags at: the critical value, or the floor if larger."""
    return math.exp(max(t_ppf(1 - alpha, df) * se, math.log1p(MIN_CHANGE))) - 1


def _detectable(se: float, df: float, alpha: float, power: float) -> float:
    """The true move seen with probability ``power``: ``t_{power}`` standard errors beyond
    the point the rule flags at."""
    return (1 + _flag_at(se, df, alpha)) * math.exp(t_ppf(power, df) * se) - 1


def repeats_for(sd: float, target: float = TARGET_MDC, alpha: float = ALPHA,
                most: int = 1000, extra_df: float = 0.0) -> int | None:
    """The fewest repeats a side (two results of ``n`` repeats each, the pair test above,
    ``extra_df``: a prior's degrees of freedom) at which noise ``sd`` (deviation of the
    logs) has an MDC of at most ``target``; None beyond ``most`` or without a finite ``sd``."""
    if not math.isfinite(sd):
        return None
    for n in range(2, most + 1):  # the MDC falls as n grows: the first n that reaches it
        if mdc(sd, n, n, 2 * n - 2 + extra_df, alpha) <= target:
            return n
    return None


def by_results(baseline: list[list[float]]) -> bool:
    """Whether ``test`` takes the baseline's results as its units (``HISTORY_RESULTS`` or
    more with values), not their repeats."""
    return sum(bool(log_values(g)) for g in baseline) >= HISTORY_RESULTS


def spread(baseline: list[list[float]], current: list[float]) -> tuple[list[float], int]:
    """The deviations and degrees of freedom ``test`` measures a metric's noise by (of the
    results' mean logs from ``HISTORY_RESULTS`` baseline results on, else of the repeats'
    logs about each result's mean, the current result's too): a ``moderation.Prior`` is
    fitted on their squares and on their correlation across cells."""
    return _units([g for g in (log_values(g) for g in baseline) if g],
                  log_values(current))[1:3]


def _units(base: list[list[float]], cur: list[float]
           ) -> tuple[float, list[float], int, float]:
    """The baseline's centre, the noise's deviations and degrees of freedom, and the
    factor from the noise's deviation to the standard error of the move."""
    if len(base) >= HISTORY_RESULTS:  # each result one value: its mean
        means = [sum(g) / len(g) for g in base]
        r, df = residuals([means])
        return sum(means) / len(means), r, df, math.sqrt(1 + 1 / len(means))
    n_b, n_c = sum(len(g) for g in base), len(cur)
    r, df = residuals([*base, cur] if cur else base)
    return (sum(x for g in base for x in g) / n_b, r, df,
            math.sqrt(1 / n_b + 1 / n_c) if n_c else math.nan)


def test(baseline: list[list[float]], current: list[float], higher_is_better: bool = True,
         alpha: float = ALPHA, consecutive: bool = False,
         prior: moderation.Prior = moderation.NONE) -> Test:
    """The rule above: ``baseline`` is one list of repeats per earlier result (oldest
    first); from ``HISTORY_RESULTS`` results on, the night-level test. ``consecutive``:
    this is one of two nights judged together against the same results (the over-nights
    label): from ``HISTORY_RESULTS`` results on, tested at ``consecutive_level`` and with
    the two nights' MDC; with fewer, as a single comparison. ``prior``: the metric's noise
    over the comparison's cells (``moderation``); the cell's own noise is moderated by it
    and its degrees of freedom grow by the prior's."""
    base = [g for g in (log_values(g) for g in baseline) if g]
    cur = log_values(current)
    if not base or not cur:
        return _too_few(math.nan)
    mean_c = sum(cur) / len(cur)
    centre, dev, own_df, factor = _units(base, cur)
    change = math.exp(mean_c - centre) - 1
    if own_df < 1:
        return _too_few(change)
    var, df = prior.moderate(sum(x * x for x in dev), own_df)
    nights = len(base) if consecutive and len(base) >= HISTORY_RESULTS else 0
    # each of two nights at the level that makes the pair's rate alpha
    level = consecutive_level(nights, alpha, df) if nights else alpha
    sd = math.sqrt(var)
    se = sd * factor
    diff = mean_c - centre
    t = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    critical = t_ppf(1 - level, df)
    big = abs(diff) >= math.log1p(MIN_CHANGE)  # the floor, symmetric in the logs
    worse = big and (t < -critical if higher_is_better else t > critical)
    better = big and (t > critical if higher_is_better else t < -critical)
    verdict = "regression" if worse else "improvement" if better else "within-noise"
    seen = (consecutive_mdc(sd, nights, alpha, df=df) if nights
            else _detectable(se, df, alpha, POWER))
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
    if not base:
        return math.nan
    _, dev, df, _ = _units(base, [])
    return math.sqrt(sum(x * x for x in dev) / df) if df else math.nan


def interval(values, level: float = INTERVAL) -> tuple[float, float]:  # noqa: ANN001
    """A ``level`` confidence interval of the geometric mean of ``values`` (a t interval on
    the logs, the noise model of ``test``); NaNs under two values."""
    logs = log_values(values)
    if len(logs) < 2:
        return math.nan, math.nan
    ss, df = centred([logs])
    m = sum(logs) / len(logs)
    half = t_ppf(0.5 + level / 2, df) * math.sqrt(ss / df / len(logs))
    return math.exp(m - half), math.exp(m + half)


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


def consecutive_level(n: int, alpha: float = ALPHA, df: float | None = None) -> float:
    """The one-sided rate per night at which two nights tested against the same ``n``
    earlier results (``n >= HISTORY_RESULTS``: each result one value) both break the rule
    the same way with probability ``alpha`` (at most ``alpha`` with the ``MIN_CHANGE``
    floor, which only removes breaks); ``df``: the noise estimate's degrees of freedom
    (None: n - 1, the history's own)."""
    df = n - 1 if df is None else df
    return t_sf(shared_history.critical(n, alpha, df), df)


def consecutive_mdc(sd: float, n: int, alpha: float = ALPHA, power: float = POWER,
                    df: float | None = None) -> float:
    """The smallest relative move lasting two nights that the two-night label flags with
    probability ``power``, for night-level noise ``sd`` (the deviation of the results'
    mean logs; ``df`` its degrees of freedom, None: n - 1) and ``n`` earlier results; the
    ``MIN_CHANGE`` floor is counted inside the probability (each night must pass both it
    and the critical value), in noise deviations to three figures (one computation
    serves many cells)."""
    if n < HISTORY_RESULTS or not math.isfinite(sd):
        return math.inf
    if sd <= 0:
        return MIN_CHANGE
    df = n - 1 if df is None else df
    floor = float(f"{math.log1p(MIN_CHANGE) / sd:.3g}")
    lowest = stats.chi.ppf(1e-9, df) / math.sqrt(df)  # the smallest s that counts
    if floor <= shared_history.critical(n, alpha, df) * lowest * math.sqrt(1 + 1 / n):
        floor = -math.inf  # the critical value is beyond the floor wherever it matters
    return math.expm1(shared_history.persistent_shift(n, alpha, power, floor, df) * sd)
