"""The false-alarm rate per comparison (``verdicts.SUITE_ALPHA`` split over a comparison's
judged metrics, ``regressions.family_alpha``): the judged metrics are counted as the rule
judges them (counted here by hand from the cells built), and simulated comparisons of
unchanged suites flag any regression at the Bonferroni rate, which for independent
metrics is ``1 - (1 - rate / m)^m`` (closed form), where a fixed rate per metric flags
``1 - (1 - alpha)^m`` of them; a drop at a known p-value (closed form) is flagged alone and
not among many judged metrics, by the functions and by ``pipebench regressions``."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest
from scipy import stats

from harness.cli import main
from harness.reporting.regressions import compare_results, family_alpha, has_regression
from harness.reporting.results import SCHEMA, summarise
from harness.reporting.verdicts import SUITE_ALPHA, per_metric, rule_text

THR, REF_THR = "throughput_samples_per_s", "throughput_per_reference"
BUBBLE = "bubble_fraction"


def _result(cells: dict[str, dict[str, list[float]]]) -> dict:
    """A suite result of these cells (key -> metric -> repeats)."""
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
    assert f"(Bonferroni; 3 judged here: {SUITE_ALPHA / 3:.2g} each)" in rule_text(SUITE_ALPHA, 3)
    assert "(Bonferroni; none judged here)" in rule_text(SUITE_ALPHA, 0)
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


SD = 0.05  # each result's repeats have logs (-SD, 0, SD) about their mean


def _at_p(p: float) -> float:
    """The drop (a log move) that a pair of 3 against 3 such repeats sees at one-sided p:
    pooled deviation SD, standard error SD sqrt(2/3), 4 degrees of freedom."""
    return stats.t.ppf(1 - p, 4) * SD * math.sqrt(2 / 3)


def _moved_pair(p: float, others: int) -> tuple[dict, dict]:
    """A baseline and a current result: cell ``s0``'s throughput drops by ``_at_p(p)``, the
    ``others`` cells' stay where they were (each has the same noise: all are judged)."""
    def logs(d: float) -> list[float]:
        return [100 * math.exp(d + x) for x in (-SD, 0.0, SD)]
    keys = [f"k/t/w2/s{i}/throughput" for i in range(others + 1)]
    base = _result({k: {THR: logs(0.0)} for k in keys})
    cur = _result({k: {THR: logs(-_at_p(p) if i == 0 else 0.0)} for i, k in enumerate(keys)})
    return base, cur


def test_the_level_follows_the_count_of_judged_metrics() -> None:
    """A drop at one-sided p = 0.01 (15% here, above the 2% floor): alone (one judged
    metric, tested at 0.05) it is a regression; among 100 judged metrics (0.05 / 100 =
    0.0005 each) it is not; at the old 0.001 per metric it was not even alone. Each cell
    judged on its own noise (``moderate=False``: the level is the point here; the prior
    is ``test_moderation``'s)."""
    assert math.expm1(_at_p(0.01)) > 0.02
    base, cur = _moved_pair(0.01, 0)
    level, judged = family_alpha([base], cur)
    assert judged == 1 and level == pytest.approx(0.05)
    assert has_regression(compare_results([base], cur, level, moderate=False))
    assert not has_regression(compare_results([base], cur, 0.001, moderate=False))
    crowd = _moved_pair(0.01, 99)
    level, judged = family_alpha([crowd[0]], crowd[1])
    assert judged == 100 and level == pytest.approx(0.0005)
    assert not has_regression(compare_results([crowd[0]], crowd[1], level, moderate=False))
    # a drop at p = 1e-5 is seen in the crowd too, and in its own cell only
    crowd = _moved_pair(1e-5, 99)
    flagged = {c.cell for c in compare_results([crowd[0]], crowd[1], level, moderate=False)
               if c.verdict == "regression"}
    assert flagged == {"k/t/w2/s0/throughput"}


def _regressions(argv: list[str], out: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["pipebench", "regressions", *argv, "-o", str(out)])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    return code, out.read_text()


def test_the_cli_judges_at_the_split_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture) -> None:
    """``pipebench regressions`` on the drop at p = 0.01 of one judged metric: at the
    default rate per comparison a regression (exit 1), at ``--alpha 0.001`` not (exit 0),
    and its rule line says how it split the rate."""
    base, cur = _moved_pair(0.01, 0)
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "cur.json").write_text(json.dumps(cur))
    args = ["--current", str(tmp_path / "cur.json"), "--baseline", str(tmp_path / "base.json")]
    code, text = _regressions(args, tmp_path / "a.md", monkeypatch)
    assert code == 1 and "Verdict: REGRESSION." in text, text
    assert f"(Bonferroni; 1 judged here: {SUITE_ALPHA:.2g} each)" in text, text
    code, text = _regressions([*args, "--alpha", "0.001"], tmp_path / "b.md", monkeypatch)
    assert code == 0 and "Verdict: no regression." in text, text
    capsys.readouterr()
