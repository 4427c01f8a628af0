"""The decision rule (harness/reporting/verdicts.py) against simulated samples with known
shifts: its false-alarm rate is the one it states, its power the noncentral t's, and
its minimum detectable change is detected at the stated power."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from harness.reporting import seeds, verdicts

TRIALS = 4000


def _sample(rng: random.Random, n: int, shift: float, sd: float) -> list[float]:
    return [1000 * math.exp(shift + rng.gauss(0, sd)) for _ in range(n)]


def _rate(shift: float, sd: float, n_b: int, n_c: int, alpha: float, seed: int) -> float:
    rng = random.Random(seed)
    hits = 0
    for _ in range(TRIALS):
        r = verdicts.test([_sample(rng, n_b, 0, sd)], _sample(rng, n_c, shift, sd),
                          higher_is_better=True, alpha=alpha)
        hits += r.verdict == "regression"
    return hits / TRIALS


def _binomial_tol(p: float) -> float:
    return 4 * math.sqrt(p * (1 - p) / TRIALS) + 1e-3


@pytest.mark.parametrize("n_b, n_c", [(3, 3), (15, 3), (5, 5)])
def test_false_alarm_rate_is_alpha(n_b: int, n_c: int) -> None:
    alpha = 0.05  # large enough to measure in a few thousand trials
    rate = _rate(0.0, 0.08, n_b, n_c, alpha, seed=n_b * 100 + n_c)
    assert abs(rate - alpha) < _binomial_tol(alpha)


@pytest.mark.parametrize("shift", [-0.05, -0.10, -0.20])
def test_power_is_the_noncentral_t(shift: float) -> None:
    sd, n_b, n_c, alpha = 0.06, 9, 3, 0.01
    df = n_b + n_c - 2
    delta = -shift / (sd * math.sqrt(1 / n_b + 1 / n_c))
    analytic = stats.nct.sf(stats.t.ppf(1 - alpha, df), df, delta)
    rate = _rate(shift, sd, n_b, n_c, alpha, seed=int(-shift * 1000))
    assert abs(rate - analytic) < _binomial_tol(analytic)


def test_the_stated_mdc_is_detected_at_the_stated_power() -> None:
    sd, n_b, n_c, alpha = 0.05, 12, 4, 0.01
    change = verdicts.mdc(sd, n_b, n_c, n_b + n_c - 2, alpha=alpha, power=0.9)
    rate = _rate(-math.log1p(change), sd, n_b, n_c, alpha, seed=7)
    assert 0.85 < rate < 0.95  # the MDC's normal approximation to the noncentral t


@pytest.mark.parametrize("sd", [0.02, 0.05, 0.12])
def test_repeats_for_a_target_match_the_noncentral_t(sd: float) -> None:
    """The fewest repeats a side at which a 10% drop is seen at the stated power, against
    a brute force over the exact power (the noncentral t): equal, or one off where the
    MDC's normal approximation sits at the boundary."""
    alpha, shift = 0.001, math.log(1.1)

    def exact(n: int) -> float:
        df = 2 * n - 2
        return stats.nct.sf(stats.t.ppf(1 - alpha, df), df, shift / (sd * math.sqrt(2 / n)))

    brute = next(n for n in range(2, 2000) if exact(n) >= verdicts.POWER)
    got = verdicts.repeats_for(sd, 0.10, alpha)
    assert got is not None and abs(got - brute) <= 1
    assert verdicts.mdc(sd, got, got, 2 * got - 2, alpha) <= 0.10
    assert verdicts.repeats_for(math.nan) is None and verdicts.repeats_for(1.0, most=50) is None


def test_a_move_under_the_floor_is_never_flagged() -> None:
    """Peak memory barely varies: a 1% move with 0.01% noise is far beyond any critical
    value, but under MIN_CHANGE; a 3% move is flagged, and the MDC is at least the floor."""
    base = [[1000.0, 1000.1, 999.9, 1000.05]]
    assert verdicts.test(base, [990.0, 990.1, 989.9]).verdict == "within-noise"
    assert verdicts.test(base, [1010.0, 1010.1]).verdict == "within-noise"
    assert verdicts.test(base, [970.0, 970.1, 969.9]).verdict == "regression"
    assert verdicts.test(base, [1030.0, 1030.1], higher_is_better=False).verdict == \
        "regression"
    r = verdicts.test(base, [1000.0, 1000.2])
    assert r.flag_at == pytest.approx(verdicts.MIN_CHANGE)
    assert verdicts.MIN_CHANGE < r.mdc < verdicts.MIN_CHANGE + 0.001  # + t_power se (tiny)
    assert verdicts.mdc(1e-5, 3, 3, 4) == pytest.approx(verdicts.MIN_CHANGE, rel=1e-3)


def test_where_the_floor_binds_the_mdc_is_seen_at_the_stated_power() -> None:
    """With noise well under the floor, a true move of the stated MDC is flagged in about
    POWER of the trials (the floor alone would be seen in half of them)."""
    sd, n = 0.004, 8
    change = verdicts.mdc(sd, n, n, 2 * n - 2)
    assert change > verdicts.MIN_CHANGE * 1.05  # the floor binds, plus t_power se
    rng = random.Random(11)
    hits = sum(verdicts.test([_sample(rng, n, 0, sd)], _sample(rng, n, -math.log1p(change),
                                                                sd)).verdict == "regression"
               for _ in range(TRIALS))
    assert abs(hits / TRIALS - verdicts.POWER) < _binomial_tol(verdicts.POWER) + 0.02


def test_direction_noise_and_labels() -> None:
    base = [[100.0, 101.0, 99.0], [110.0, 111.0, 109.0]]  # two nights, drifted by 10%
    same = verdicts.test(base, [105.0, 104.0, 106.0])
    assert same.verdict == "within-noise"
    # the night-to-night drift is not noise: deviations are taken about each night's mean
    assert same.sd == pytest.approx(math.sqrt(sum(
        (math.log(x) - sum(map(math.log, g)) / 3) ** 2 for g in
        [*base, [105.0, 104.0, 106.0]] for x in g) / 6))
    slow = verdicts.test(base, [80.0, 81.0, 79.0])
    assert slow.verdict == "regression" and slow.change < -0.2
    assert verdicts.test(base, [80.0, 81.0, 79.0], higher_is_better=False).verdict == \
        "improvement"
    assert verdicts.test([[1.0]], [1.0]).verdict == "too-few-repeats"
    ok, bad = slow, verdicts.test(base, [105.0, 104.0, 106.0])
    def label(tests: list[verdicts.Test], history: int) -> str:
        return verdicts.night_label([t.verdict for t in tests], history)

    assert label([bad, slow], history=5) == "suspicious"
    assert label([slow, slow], history=5) == "regression"
    assert label([slow], history=1) == "insufficient data"
    assert label([ok, bad], history=5) == "ok"


def _drifting_nights(rng: random.Random, nights: int, repeats: int, drift: float,
                     sd: float, shift: float = 0.0) -> list[list[float]]:
    out = []
    for i in range(nights):
        level = rng.gauss(0, drift) + (shift if i == nights - 1 else 0.0)
        out.append([1000 * math.exp(level + rng.gauss(0, sd)) for _ in range(repeats)])
    return out


def test_over_a_history_drift_between_nights_is_noise_and_alpha_holds() -> None:
    """Nights drift by 8% while repeats agree to 1%: the night-level test keeps its
    false-alarm rate; the repeats-only test, blind to drift, would cry wolf."""
    alpha, rng = 0.05, random.Random(11)
    history = pairwise = 0
    for _ in range(TRIALS):
        *base, cur = _drifting_nights(rng, 6, 3, drift=0.08, sd=0.01)
        history += verdicts.test(base, cur, alpha=alpha).verdict == "regression"
        pairwise += verdicts.test(base[-1:], cur, alpha=alpha).verdict == "regression"
    assert abs(history / TRIALS - alpha) < _binomial_tol(alpha)
    assert pairwise / TRIALS > 5 * alpha


def test_over_a_history_power_is_the_noncentral_t() -> None:
    alpha, rng, n, shift, drift = 0.05, random.Random(5), 8, -0.10, 0.04
    hits = 0
    for _ in range(TRIALS):
        *base, cur = _drifting_nights(rng, n + 1, 3, drift=drift, sd=0.0, shift=shift)
        hits += verdicts.test(base, cur, alpha=alpha).verdict == "regression"
    delta = -shift / (drift * math.sqrt(1 + 1 / n))
    analytic = stats.nct.sf(stats.t.ppf(1 - alpha, n - 1), n - 1, delta)
    assert abs(hits / TRIALS - analytic) < _binomial_tol(analytic)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_interval_covers_the_geometric_mean_at_its_level(n: int) -> None:
    """The cell's error bar (``verdicts.interval``): over simulated repeats with a known
    centre (1000), the interval holds it in ``INTERVAL`` of the trials."""
    rng = random.Random(n)
    inside = 0
    for _ in range(TRIALS):
        lo, hi = verdicts.interval(_sample(rng, n, 0.0, 0.1))
        inside += lo <= 1000 <= hi
    level = verdicts.INTERVAL
    assert abs(inside / TRIALS - level) < _binomial_tol(level)
    assert all(math.isnan(v) for v in verdicts.interval([5.0]))


def test_a_faster_claim_over_seeds_holds_its_level_and_sees_a_real_gap() -> None:
    """``seeds.faster`` (time to target over seeds, one-sided): equal systems are shown
    faster in TTA_ALPHA of the trials; a 30% gap with 5% noise over 5 seeds nearly always."""
    rng = random.Random(11)
    trials = 2000
    same = sum(seeds.faster(_sample(rng, 5, 0, 0.1), _sample(rng, 5, 0, 0.1)).shown
               for _ in range(trials)) / trials
    assert abs(same - seeds.TTA_ALPHA) < 4 * math.sqrt(0.05 * 0.95 / trials) + 0.01
    gap = sum(seeds.faster(_sample(rng, 5, math.log(0.7), 0.05),
                              _sample(rng, 5, 0, 0.05)).shown for _ in range(200)) / 200
    assert gap > 0.99
    f = seeds.faster([7.0, 7.0, 7.1], [10.0, 10.0, 10.1])
    assert f.low < f.ratio < f.high < 1 and f.shown


def test_moved_agrees_with_scipy_s_two_sided_t_test_and_holds_its_level() -> None:
    """``moved`` (is the drift reference's shift real?) against an independent reference:
    scipy's two-sided pooled t-test on the logs; on unshifted samples it says "moved" at
    its level, and it sees a shift either way."""
    rng = random.Random(11)
    hits = 0
    for _ in range(TRIALS):
        base, cur = _sample(rng, 4, 0, 0.05), _sample(rng, 3, 0, 0.05)
        p = stats.ttest_ind([math.log(x) for x in base], [math.log(x) for x in cur]).pvalue
        got = verdicts.moved([base], cur, 0.05)
        assert got == (p < 0.05) or abs(p - 0.05) < 1e-9
        hits += got
    assert abs(hits / TRIALS - 0.05) < _binomial_tol(0.05)
    assert verdicts.moved([[100.0, 101.0, 99.0]], [60.0, 61.0, 59.0])
    assert verdicts.moved([[100.0, 101.0, 99.0]], [160.0, 161.0, 159.0])
    assert not verdicts.moved([[100.0]], [60.0])  # no degree of freedom: no claim


def test_the_fast_t_quantiles_equal_scipy_stats() -> None:
    """``t_ppf`` and ``t_sf`` (the rule's quantiles without scipy.stats' argument checks)
    give scipy.stats' values bit for bit, at the tails and at fractional and infinite
    degrees of freedom; so does moderation's F quantile."""
    from scipy import special

    dfs = (1, 1.5, 2, 4, 7.3, 20, 100.5, 1e6, math.inf)
    for df in dfs:
        for q in (0.0, 1e-9, 0.00125, 0.05, 0.5, 0.9, 0.975, 1 - 1e-12, 1.0):
            assert verdicts.t_ppf(q, df) == float(stats.t.ppf(q, df)), (q, df)
        for x in (-math.inf, -5, -1, 0, 0.3, 2, 10, math.inf):
            assert verdicts.t_sf(x, df) == float(stats.t.sf(x, df)), (x, df)
        for d0 in (1, 3.2, 10, 1e4) if math.isfinite(df) else ():  # a cell's and its
            # prior's degrees of freedom, finite (MAX_DF): scipy's F is NaN at inf
            assert special.fdtri(df, d0, 1 - 0.01) == float(stats.f.isf(0.01, df, d0))
