"""The false-alarm rate per comparison (``verdicts.SUITE_ALPHA`` split over a comparison's
judged metrics, ``regressions.family_alpha``): the judged metrics are counted as the rule
judges them (counted here by hand from the cells built), and simulated comparisons of
unchanged suites flag any regression at the Bonferroni rate, which for independent
metrics is ``1 - (1 - rate / m)^m`` (closed form), where a fixed rate per metric flags
``1 - (1 - alpha)^m`` of them."""

from __future__ import annotations

import math
import random

import pytest

from harness.reporting.regressions import compare_results, family_alpha, has_regression
from harness.reporting.results import SCHEMA, summarise
from harness.reporting.verdicts import SUITE_ALPHA, per_metric, rule_text

THR, REF_THR = "throughput_samples_per_s", "throughput_per_reference"
BUBBLE = "bubble_fraction"


def _result(cells: dict[str, dict[str, list[float]]]) -> dict:
    return {"schema": SCHEMA, "created": "2026-01-01T00:00:00+00:00", "suite": {"name": "t"},
            "environment": {"machine": "m"},
            "cells": [{"key": key, "status": "ok", "note": "",
                       "metrics": {n: summarise(v).to_json() for n, v in figures.items()},
                       "counters": {}, "counters_consistent": True}
                      for key, figures in cells.items()]}


def test_the_comparison_counts_the_metrics_it_judges() -> None:
    """Cell a: throughput raw and drift-cancelled (a twin pair: one judged) and the bubble:
    2. Cell b: throughput alone: 1. Cell c: one repeat (no noise estimate, cannot flag): 0.
    So 3 judged, each at SUITE_ALPHA / 3."""
    r = _result({"k/t/w2/a/throughput": {THR: [100.0, 101.0, 99.0],
                                         REF_THR: [1.0, 1.01, 0.99],
                                         BUBBLE: [0.2, 0.21, 0.19]},
                 "k/t/w2/b/throughput": {THR: [50.0, 51.0, 49.0]},
                 "k/t/w2/c/throughput": {THR: [70.0]}})
    level, judged = family_alpha([r], r)
    assert judged == 3
    assert level == pytest.approx(SUITE_ALPHA / 3) == per_metric(3)
    assert family_alpha([r], r, 0.01) == (pytest.approx(0.01 / 3), 3)
    assert family_alpha([], r) == (SUITE_ALPHA, 0)  # nothing to judge: a family of one
    assert f"(3 judged here: {SUITE_ALPHA / 3:.2g} each)" in rule_text(SUITE_ALPHA, 3)
    assert f"{SUITE_ALPHA:g} per comparison" in rule_text()


def _suite(rng: random.Random, m: int, sd: float) -> dict:
    return _result({f"k/t/w2/s{i}/throughput": {THR: [100 * math.exp(rng.gauss(0, sd))
                                                      for _ in range(3)]} for i in range(m)})


@pytest.mark.parametrize("m", [1, 20])
def test_an_unchanged_suite_flags_a_regression_at_the_rate_per_comparison(m: int) -> None:
    """Normal noise that the repeats tell whole, m independent cells, 3 repeats a side: a
    comparison flags any regression with probability 1 - (1 - rate/m)^m (0.05 for one
    metric, 0.0494 for 20); at 0.001 a metric, 20 metrics would flag 1 - 0.999^20 = 0.0198
    of them, and the nightly's hundreds far more (the reason for the rate per
    comparison). 1200 simulated comparisons: 3.5 binomial deviations."""
    rng, n = random.Random(m), 1200
    flagged = 0
    for _ in range(n):
        base, cur = _suite(rng, m, 0.1), _suite(rng, m, 0.1)
        level, judged = family_alpha([base], cur)
        assert judged == m
        flagged += has_regression(compare_results([base], cur, level))
    expect = 1 - (1 - SUITE_ALPHA / m) ** m
    assert abs(flagged / n - expect) < 3.5 * math.sqrt(expect * (1 - expect) / n)


def test_a_slowdown_of_one_cell_is_seen_at_the_family_level_and_not_in_the_others() -> None:
    """A 40% slowdown of one of 20 cells (noise 3% a repeat) is flagged in that cell; the
    19 unchanged cells are not flagged in any of 200 comparisons more often than the rate
    allows (each comparison's chance of a false flag is at most SUITE_ALPHA)."""
    rng = random.Random(3)
    hits = others = 0
    for _ in range(200):
        base, cur = _suite(rng, 20, 0.03), _suite(rng, 20, 0.03)
        slow = [x * 0.6 for x in cur["cells"][0]["metrics"][THR]["values"]]
        cur["cells"][0]["metrics"][THR] = summarise(slow).to_json()
        changes = compare_results([base], cur, family_alpha([base], cur)[0])
        hits += any(c.cell.endswith("/s0/throughput") and c.verdict == "regression"
                    for c in changes)
        others += any(not c.cell.endswith("/s0/throughput") and c.verdict == "regression"
                      for c in changes)
    assert hits >= 190
    assert others <= 200 * SUITE_ALPHA + 3.5 * math.sqrt(200 * SUITE_ALPHA)
