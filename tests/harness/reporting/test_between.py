"""The between-results noise (``harness.reporting.between``) against simulated results with
known noise, and the pair test's false-alarm rate it predicts against a brute-force run of
the rule itself.

Why: results/nightly-aa.md explains the pair test's excess false alarms by this ratio; a
wrong ratio or rate would explain them away. The references here are the model's closed
form (the ratio is ``1 + n tau^2 / sigma^2`` for ``n`` repeats) and ``verdicts.test``
applied to thousands of simulated pairs, never ``between`` itself.
"""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from harness.reporting import between, verdicts

NAME = "throughput_samples_per_s"


def _results(cells: int, runs: int, repeats: int, tau: float, sigma: float,
             seed: int = 0) -> list[dict]:
    """``runs`` suite results of ``cells`` cells: each run shifts each cell's log by a
    normal ``tau``, each repeat by a normal ``sigma``."""
    rng = random.Random(seed)
    out = [{"cells": []} for _ in range(runs)]
    for k in range(cells):
        base = math.log(1000.0 + k)
        for r in out:
            shift = rng.gauss(0.0, tau)
            values = [math.exp(base + shift + rng.gauss(0.0, sigma)) for _ in range(repeats)]
            r["cells"].append({"key": f"w/tiny/w2/s{k}/throughput", "status": "ok",
                               "metrics": {NAME: {"values": values}}})
    return out


@pytest.mark.parametrize(("tau", "sigma", "repeats"), [(0.0, 0.1, 3), (0.05, 0.1, 3),
                                                       (0.1, 0.1, 5)])
def test_ratio_matches_the_closed_form(tau: float, sigma: float, repeats: int) -> None:
    got = between.inflation(_results(600, 2, repeats, tau, sigma), NAME)
    expected = 1 + repeats * tau ** 2 / sigma ** 2
    assert got.cells == 600 and got.results == 2 and got.repeats == repeats
    # pooled over 600 cells, one degree of freedom each: a relative error of ~sqrt(2/600)
    assert got.ratio == pytest.approx(expected, rel=0.2)


def test_cells_missing_from_a_run_or_with_one_repeat_are_left_out() -> None:
    runs = _results(4, 3, 3, 0.0, 0.1)
    runs[1]["cells"].pop(0)  # cell 0 not in every run
    runs[2]["cells"][1]["metrics"][NAME]["values"] = [1.0]  # cell 1: one repeat
    runs[0]["cells"][2]["status"] = "failed"  # cell 2 failed once
    assert between.inflation(runs, NAME).cells == 1
    assert math.isnan(between.inflation(runs, "absent_metric").ratio)


def test_pair_rate_is_alpha_without_between_noise() -> None:
    for n in (2, 3, 5):
        assert between.pair_rate(1.0, n, 0.01) == pytest.approx(0.01, rel=1e-9)
    assert math.isnan(between.pair_rate(2.0, 1))  # no degree of freedom


def test_pair_rate_on_a_moderated_noise_s_degrees_of_freedom() -> None:
    """With a prior's degrees of freedom the rate at ratio 1 is still alpha, and at ratio 2
    it is the closed form on those degrees of freedom: at the nightly's 1e-4 a metric,
    several times what 2 x 3 - 2 = 4 gave (a lower critical value, a thinner tail)."""
    assert between.pair_rate(1.0, 3, 1e-4, df=104.0) == pytest.approx(1e-4, rel=1e-6)
    closed = stats.t.sf(stats.t.isf(1e-4, 104.0) / math.sqrt(2), 104.0)
    assert between.pair_rate(2.0, 3, 1e-4, df=104.0) == pytest.approx(closed, rel=1e-9)
    assert closed > 3 * between.pair_rate(2.0, 3, 1e-4)


@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_pair_rate_matches_the_rule_run_on_simulated_pairs(ratio: float) -> None:
    """Brute force: ``verdicts.test`` of one result against another, each of 3 repeats
    whose logs have noise sigma, the two results' means also shifted by tau with
    1 + 3 tau^2 / sigma^2 = ratio; its share of regressions is the false-alarm rate.
    sigma is large so that the 2% floor almost never binds."""
    alpha, n, sigma, trials = 0.02, 3, 0.5, 10000
    tau = sigma * math.sqrt((ratio - 1) / n)
    rng = random.Random(7)
    flags = 0
    for _ in range(trials):
        a, b = (rng.gauss(0.0, tau) for _ in range(2))
        base = [math.exp(a + rng.gauss(0.0, sigma)) for _ in range(n)]
        cur = [math.exp(b + rng.gauss(0.0, sigma)) for _ in range(n)]
        flags += verdicts.test([base], cur, True, alpha).verdict == "regression"
    p = between.pair_rate(ratio, n, alpha)
    assert ratio > 1 or p == pytest.approx(alpha)
    # within 4 binomial standard errors of the closed form
    assert abs(flags / trials - p) < 4 * math.sqrt(p * (1 - p) / trials)
