"""The two nights' label (verdicts.consecutive_level / consecutive_mdc, used by
regressions.over_nights) against brute force: simulated histories of night-level values,
the night-level test written out again here with numpy, and the rate at which two new
nights both break it counted over many trials."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from harness.reporting import verdicts
from harness.reporting.regressions import over_nights
from harness.reporting.results import SCHEMA, summarise

TRIALS = 400_000


def _both_drop(n: int, level: float, shift: float, seed: int,
               floor: float = -math.inf) -> float:
    """Share of trials in which two new nights, each moved by ``shift`` deviations, both
    lie below the night-level test's critical value at ``level``, tested against the same
    ``n`` earlier nights (their mean and sample deviation), and at least ``floor``
    deviations below that mean (the rule's MIN_CHANGE, in units of the noise)."""
    rng = np.random.default_rng(seed)
    history = rng.standard_normal((TRIALS, n))
    mean, sd = history.mean(axis=1), history.std(axis=1, ddof=1)
    se = sd * math.sqrt(1 + 1 / n)
    critical = stats.t.isf(level, n - 1)
    nights = rng.standard_normal((TRIALS, 2)) - shift
    beyond = ((nights - mean[:, None]) / se[:, None] < -critical) & \
        (mean[:, None] - nights >= floor)
    return float(beyond.all(axis=1).mean())


def _tolerance(p: float) -> float:
    return 4 * math.sqrt(p * (1 - p) / TRIALS)


@pytest.mark.parametrize("n", [3, 5, 8])
def test_two_nights_break_together_at_the_stated_rate(n: int) -> None:
    """Under no change both nights break with probability alpha; each night alone at the
    level is more often than alpha (the shared history makes the two dependent, so the
    level is well under sqrt(alpha), but testing each at alpha would waste power)."""
    alpha = 0.01  # large enough to count in a few hundred thousand trials
    level = verdicts.consecutive_level(n, alpha)
    assert alpha < level < math.sqrt(alpha)
    rate = _both_drop(n, level, 0.0, seed=n)
    assert abs(rate - alpha) < _tolerance(alpha)
    at_alpha = _both_drop(n, alpha, 0.0, seed=n + 100)  # the old rule: far below alpha
    assert at_alpha < alpha / 2


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_two_nights_mdc_is_seen_on_both_at_the_stated_power(n: int) -> None:
    sd, alpha = 0.05, 0.001
    change = verdicts.consecutive_mdc(sd, n, alpha)
    shift = math.log1p(change) / sd  # in deviations of the night-level noise
    rate = _both_drop(n, verdicts.consecutive_level(n, alpha), shift, seed=10 * n)
    assert abs(rate - verdicts.POWER) < _tolerance(verdicts.POWER)
    # what it buys: the one night's MDC at alpha (the noncentral t) is larger
    critical, k = stats.t.isf(alpha, n - 1), math.sqrt(1 + 1 / n)
    one_night = next(d for d in np.arange(0.0, 200.0, 0.01)
                     if stats.nct.sf(critical, n - 1, d / k) >= verdicts.POWER)
    assert math.log1p(change) / sd < one_night
    assert verdicts.consecutive_mdc(sd, 2, alpha) == math.inf  # no night-level test


def test_at_the_nightly_rate_too() -> None:
    """At ALPHA itself (0.001: about 400 pairs in the trials, so a looser tolerance)."""
    n = 5
    rate = _both_drop(n, verdicts.consecutive_level(n), 0.0, seed=55)
    assert abs(rate - verdicts.ALPHA) < _tolerance(verdicts.ALPHA)


def test_where_the_floor_binds_the_two_nights_mdc_counts_it() -> None:
    """Noise far under MIN_CHANGE: each night must also move by the floor; the stated MDC
    is still seen on both nights at the stated power (the floor alone: about a quarter)."""
    n, sd = 5, 0.003
    change = verdicts.consecutive_mdc(sd, n)
    assert change > verdicts.MIN_CHANGE
    floor = math.log1p(verdicts.MIN_CHANGE) / sd
    rate = _both_drop(n, verdicts.consecutive_level(n), math.log1p(change) / sd, seed=9,
                      floor=floor)
    assert abs(rate - verdicts.POWER) < _tolerance(verdicts.POWER) + 0.005
    assert verdicts.consecutive_mdc(0.0, n) == verdicts.MIN_CHANGE


def test_any_rate_the_command_accepts_has_a_level() -> None:
    """Near a quarter, even a critical value of zero breaks both nights too rarely: the
    level then lies above one half (a negative critical value), and is still found."""
    for alpha in (0.3, 0.45):
        level = verdicts.consecutive_level(5, alpha)
        assert 0.5 < level < 1
        assert abs(_both_drop(5, level, 0.0, seed=3) - alpha) < _tolerance(alpha)


def _night(day: int, values: list[float]) -> dict:
    cell = {"key": "vgg16/tiny/w2/pipedream/throughput", "status": "ok", "note": "",
            "metrics": {"throughput_samples_per_s": summarise(values).to_json()},
            "counters": {}, "counters_consistent": True}
    return {"schema": SCHEMA, "created": f"2026-01-{day:02d}T00:00:00+00:00",
            "suite": {"name": "t"}, "environment": {"machine": "m"}, "cells": [cell]}


def test_over_nights_labels_at_the_two_levels() -> None:
    """Three earlier nights; a drop between the two nights' threshold and the one night's:
    on two nights in a row a regression (the old rule, both at alpha, saw nothing), on
    tonight alone nothing; a drop beyond the one night's threshold is suspicious."""
    earlier = [100.0, 104.0, 97.0]
    logs = np.log(earlier)
    sd, n = logs.std(ddof=1), len(earlier)
    se = sd * math.sqrt(1 + 1 / n)
    pair_t = stats.t.isf(verdicts.consecutive_level(n), n - 1)
    one_t = stats.t.isf(verdicts.ALPHA, n - 1)
    assert pair_t < one_t
    between = float(np.exp(logs.mean() - (pair_t + one_t) / 2 * se))
    beyond = float(np.exp(logs.mean() - 1.1 * one_t * se))
    history = [_night(i + 1, [v, v]) for i, v in enumerate(earlier)]

    def label(last_night: float, tonight: float) -> str:
        changes = over_nights([*history, _night(4, [last_night] * 2)],
                              _night(5, [tonight] * 2), window=n)
        (c,) = [c for c in changes if c.name == "throughput_samples_per_s"]
        return c.verdict

    assert label(between, between) == "regression"
    assert label(100.0, between) == "changed-within-noise"
    assert label(between, 100.0) == "changed-within-noise"
    assert label(100.0, beyond) == "suspicious"
    assert label(beyond, beyond) == "regression"
    up_between = float(np.exp(2 * logs.mean())) / between  # the same moves upwards
    up_beyond = float(np.exp(2 * logs.mean())) / beyond
    assert label(up_between, up_between) == "improvement"
    assert label(100.0, up_beyond) == "improvement (one night)"
    assert label(up_between, between) == "changed-within-noise"  # opposite ways


def test_the_detectability_line_says_which_mdc_it_counts() -> None:
    """Over nights a metric with enough history carries the two nights' MDC and one
    without carries a single comparison's; the line counts both, so it says how many are
    which. Against one baseline (no night-level test) it says nothing of nights."""
    from harness.reporting.change_report import detectability
    from harness.reporting.regressions import compare_results

    history = [_night(i + 1, [v, v * 1.01]) for i, v in enumerate([100.0, 104.0, 97.0])]
    nightly = over_nights([*history, _night(4, [99.0, 99.5])], _night(5, [101.0, 100.5]),
                          window=3)
    judged = [c for c in nightly if c.name == "throughput_samples_per_s"]
    assert [c.two_nights for c in judged] == [True]
    assert judged[0].mdc == pytest.approx(verdicts.consecutive_mdc(
        verdicts.noise([[v, v * 1.01] for v in (100.0, 104.0, 97.0)]), 3), rel=1e-9)
    assert "(1 of them by the MDC of a change lasting two nights" in detectability(nightly)
    # a second cell that joined two nights ago: one earlier result, one comparison's MDC
    def with_new(day: int, values: list[float], new: list[float] | None) -> dict:
        night = _night(day, values)
        if new is not None:
            cell = dict(night["cells"][0], key="vgg16/tiny/w2/gpipe/throughput",
                        metrics={"throughput_samples_per_s": summarise(new).to_json()})
            night["cells"].append(cell)
        return night

    mixed = over_nights(
        [with_new(1, [100.0, 101.0], None), with_new(2, [104.0, 105.0], None),
         with_new(3, [97.0, 98.0], [50.0, 51.0]), with_new(4, [99.0, 99.5], [50.5, 50.0])],
        with_new(5, [101.0, 100.5], [50.2, 50.9]), window=3)
    flags = {c.cell: c.two_nights for c in mixed if c.name == "throughput_samples_per_s"}
    assert flags == {"vgg16/tiny/w2/pipedream/throughput": True,
                     "vgg16/tiny/w2/gpipe/throughput": False}
    assert "(1 of them by the MDC of a change lasting two nights" in detectability(mixed)
    pair = compare_results([_night(1, [100.0, 101.0])], _night(2, [100.5, 99.0]))
    assert not any(c.two_nights for c in pair)
    assert "two nights" not in detectability(pair)


def _both_beyond_exact(critical: float, n: int, shift: float = 0.0,
                       df: float | None = None) -> float:
    """The same probability as ``_both_drop`` (no floor) without sampling, for rates too
    small to count: given the history's deviation s, the two nights' distances from the
    history's mean, over their deviation sqrt(1 + 1/n), are standard normals correlated
    1/(n + 1) (the shared mean), so both lie below -critical * s with the bivariate
    normal's probability, by Owen's T at equal limits: Phi2(h, h; r) = Phi(h) - 2 T(h, a),
    a = sqrt((1 - r) / (1 + r)); s (chi, n - 1 degrees of freedom, over sqrt(n - 1)) is
    summed out on a fine grid by Simpson's rule. ``df``: the deviation's degrees of
    freedom where a prior adds to them (``moderation``: the moderated variance over the
    true one is a chi-square on d0 + n - 1 over its degrees of freedom, independent of
    the means)."""
    from scipy import integrate, special

    k, r, df = math.sqrt(1 + 1 / n), 1 / (n + 1), n - 1 if df is None else df
    s = np.linspace(0.0, stats.chi.isf(1e-15, df) / math.sqrt(df), 200_001)
    h = -critical * s + shift / k
    both = stats.norm.cdf(h) - 2 * special.owens_t(h, math.sqrt((1 - r) / (1 + r)))
    density = stats.chi.pdf(s * math.sqrt(df), df) * math.sqrt(df)
    return float(integrate.simpson(both * density, x=s))


def test_the_exact_reference_agrees_with_brute_force() -> None:
    """The reference below checked where sampling can count (0.01 and a shifted case)."""
    for n, shift in ((5, 0.0), (4, 1.5)):
        critical = stats.t.isf(verdicts.consecutive_level(n, 0.01), n - 1)
        counted = _both_drop(n, stats.t.sf(critical, n - 1), shift, seed=77 + n)
        exact = _both_beyond_exact(critical, n, shift)
        assert abs(counted - exact) < _tolerance(exact)


@pytest.mark.parametrize("n", [3, 5, 8])
@pytest.mark.parametrize("alpha", [1e-4, 1e-5])
def test_at_the_rates_the_nightly_uses(n: int, alpha: float) -> None:
    """A night of the nightly tests each of its metrics at 0.05 over some hundreds
    (about 1e-4): too rare to count by sampling, so against the exact reference. The
    level makes both nights break at alpha, and the MDC (noise large enough that the
    floor does not bind) is seen on both at the stated power."""
    critical = stats.t.isf(verdicts.consecutive_level(n, alpha), n - 1)
    assert _both_beyond_exact(critical, n) == pytest.approx(alpha, rel=2e-3)
    sd = 0.3
    shift = math.log1p(verdicts.consecutive_mdc(sd, n, alpha)) / sd
    assert _both_beyond_exact(critical, n, shift) == pytest.approx(verdicts.POWER, abs=1e-3)


@pytest.mark.parametrize("df", [9.5, 40.0, 400.0])
def test_with_a_prior_s_degrees_of_freedom(df: float) -> None:
    """The history's deviation moderated (``moderation``: more degrees of freedom than its
    n - 1): the level and the MDC against the exact reference on those."""
    n, alpha, sd = 5, 1e-4, 0.3
    level = verdicts.consecutive_level(n, alpha, df)
    critical = stats.t.isf(level, df)
    assert _both_beyond_exact(critical, n, df=df) == pytest.approx(alpha, rel=2e-3)
    assert level > verdicts.consecutive_level(n, alpha)  # more known: a looser level
    shift = math.log1p(verdicts.consecutive_mdc(sd, n, alpha, df=df)) / sd
    assert _both_beyond_exact(critical, n, shift, df) == pytest.approx(verdicts.POWER,
                                                                       abs=1e-3)
