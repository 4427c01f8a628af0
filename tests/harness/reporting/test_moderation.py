"""Moderated variances (harness/reporting/moderation.py) against simulation with known
truth: the prior fitted to sample variances drawn from a known prior recovers it; the
moderated test flags unchanged metrics at the rate it is run at (the t distribution on
d0 + d degrees of freedom is the closed form); where every cell has the same noise it
sees what a test knowing that noise would (the normal's closed form); and the reports'
comparison uses it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from harness.reporting import moderation, regressions, verdicts
from harness.reporting.regressions import compare_results
from harness.reporting.results import SCHEMA, summarise


def _variances(rng: np.random.Generator, cells: int, d0: float, s0sq: float, df: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """True variances from the scaled inverse chi-square prior, and each cell's sample
    variance on ``df`` degrees of freedom."""
    true = d0 * s0sq / rng.chisquare(d0, cells) if math.isfinite(d0) else np.full(cells, s0sq)
    return true, true * rng.chisquare(df, cells) / df


def test_trigamma_inverse_inverts_scipy_s_trigamma() -> None:
    for y in (0.01, 0.3, 1.0, 4.0, 50.0, 2000.0):
        x = float(special.polygamma(1, y))
        assert moderation.trigamma_inverse(x) == pytest.approx(y, rel=1e-6)


@pytest.mark.parametrize("d0, df", [(4.0, 4), (10.0, 4), (8.0, 2)])
def test_the_fit_recovers_a_known_prior(d0: float, df: int) -> None:
    rng = np.random.default_rng(int(d0 * 10 + df))
    s0sq = 0.08 ** 2
    _, s2 = _variances(rng, 80_000, d0, s0sq, df)
    prior = moderation.fit([(v, df) for v in s2])
    assert prior.d0 == pytest.approx(d0, rel=0.15)
    assert prior.s0sq == pytest.approx(s0sq, rel=0.05)
    assert prior.cells == 80_000


def test_equal_noise_gives_the_largest_prior_and_too_few_cells_none() -> None:
    rng = np.random.default_rng(5)
    _, s2 = _variances(rng, 5000, math.inf, 0.05 ** 2, 4)
    prior = moderation.fit([(v, 4) for v in s2])
    assert prior.d0 > 50 and prior.s0sq == pytest.approx(0.05 ** 2, rel=0.03)
    few = [(v, 4) for v in s2[: moderation.MIN_CELLS - 1]]
    assert moderation.fit(few) == moderation.NONE
    assert moderation.fit([(0.0, 4)] * 10 + [(0.01, 0)] * 10) == moderation.NONE
    assert moderation.NONE.moderate(0.08, 4) == (0.02, 4)


def test_a_pair_of_one_result_pools_it_twice() -> None:
    """``moderate_pair``: one result's repeats taken for both sides of a pair is the pooled
    variance of two copies of them (numpy's, on 2 (n - 1) degrees of freedom), moderated
    by the closed form (d0 s0^2 + ss) / (d0 + d)."""
    logs = np.log([1000.0, 1040.0, 985.0])
    dev, df = verdicts.spread([list(np.exp(logs))], [])
    pooled = np.concatenate([logs - logs.mean()] * 2)
    ss = float(np.sum(pooled ** 2))
    assert moderation.NONE.moderate_pair(dev, df) == (pytest.approx(ss / 4), 4)
    prior = moderation.Prior(6.0, 0.02 ** 2)
    assert prior.moderate_pair(dev, df) == (pytest.approx((6 * 0.02 ** 2 + ss) / 10), 10)


def _family(rng: np.random.Generator, cells: int, true: np.ndarray, n: int,
            shift: float = 0.0) -> list[tuple[list[float], list[float]]]:
    """Each cell's baseline and current repeats (``n`` a side), in values (the rule takes
    logs); the current ones moved by ``shift`` (a log ratio)."""
    sd = np.sqrt(true)[:, None]
    base = np.exp(7 + sd * rng.standard_normal((cells, n)))
    cur = np.exp(7 + shift + sd * rng.standard_normal((cells, n)))
    return [(list(b), list(c)) for b, c in zip(base, cur, strict=True)]


def _judge(family: list, alpha: float) -> list[verdicts.Test]:
    """Every cell tested at ``alpha`` with the prior fitted over the family, as the
    reports fit it (``regressions.priors``)."""
    prior = moderation.fit_spreads([verdicts.spread([b], c) for b, c in family])
    return [verdicts.test([b], c, True, alpha, prior=prior) for b, c in family]


def test_unchanged_metrics_flag_at_the_rate_set() -> None:
    """40 cells a family (the nightly's order), 3 repeats a side, true variances from a
    prior of 6 degrees of freedom, the prior fitted on each family itself: the share of
    cells flagged is alpha (the moderated t is a t on d0 + 4 degrees of freedom), while
    the degrees of freedom grew well beyond the cell's own 4."""
    rng = np.random.default_rng(17)
    alpha, families, cells = 0.01, 500, 40
    flags, dfs = 0, []
    for _ in range(families):
        true, _ = _variances(rng, cells, 6.0, 0.3 ** 2, 1)  # noise large: no floor
        tests = _judge(_family(rng, cells, true, 3), alpha)
        flags += sum(t.verdict == "regression" for t in tests)
        dfs.append(tests[0].df)
    trials = families * cells
    assert abs(flags / trials - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / trials) + 1e-3
    assert np.median(dfs) > 8


def test_with_equal_noise_it_sees_what_a_test_that_knew_the_noise_sees() -> None:
    """Every cell's noise the same: the prior takes it over, on as many degrees of freedom
    as the other cells have (39 cells of 4 at most, not infinitely many, since its scale
    is estimated from them); at 0.05 / 480 (the nightly's level) the MDC is near the
    known-noise test's closed form, far under the cell-alone t test's; a move of the MDC
    a test of that many degrees of freedom states is flagged at the stated power, and an
    unchanged one at the rate set."""
    rng = np.random.default_rng(23)
    sd, n, cells, alpha = 0.05, 3, 40, verdicts.per_metric(480)
    se = sd * math.sqrt(2 / n)
    known = math.expm1((stats.norm.isf(alpha) + stats.norm.ppf(verdicts.POWER)) * se)
    tests = _judge(_family(rng, cells, np.full(cells, sd ** 2), n), alpha)
    assert max(t.df for t in tests) <= cells * (2 * n - 2) + 2 * n - 2
    assert np.median([t.mdc for t in tests]) == pytest.approx(known, rel=0.1)
    assert verdicts.mdc(sd, n, n, 2 * n - 2, alpha) > 2 * known  # each cell alone
    df = float(np.median([t.df for t in tests]))
    move = -math.log1p(verdicts.mdc(sd, n, n, df, alpha))
    seen = sum(t.verdict == "regression" for _ in range(40) for t in _judge(
        _family(rng, cells, np.full(cells, sd ** 2), n, move), alpha))
    assert abs(seen / (40 * cells) - verdicts.POWER) < 0.04
    level = 0.01  # countable: the equal-noise family at the rate set
    flags = sum(t.verdict == "regression" for _ in range(300) for t in _judge(
        _family(rng, cells, np.full(cells, 0.3 ** 2), n), level))
    assert abs(flags / (300 * cells) - level) < 4 * math.sqrt(level / (300 * cells)) + 1e-3


def _result(values: list[list[float]]) -> dict:
    cells = [{"key": f"w/tiny/w2/s{i}/throughput", "status": "ok", "note": "",
              "metrics": {"throughput_samples_per_s": summarise(v).to_json()},
              "counters": {}, "counters_consistent": True} for i, v in enumerate(values)]
    return {"schema": SCHEMA, "created": "2026-01-01T00:00:00+00:00",
            "suite": {"name": "t"}, "environment": {"machine": "m"}, "cells": cells}


def test_the_comparison_moderates_over_its_cells() -> None:
    """Through ``compare_results``: 20 cells of equal noise, one slowed by 12%. Its own t
    (scipy's pooled t-test) lies between the critical value on its own 4 degrees of
    freedom and on those of the 20 cells together, at the level of 20 metrics: alone it
    is not seen, moderated by the other cells' noise it is flagged, and nothing else is."""
    rng = np.random.default_rng(29)
    fam = _family(rng, 20, np.full(20, 0.04 ** 2), 3)
    fam[7] = (fam[7][0], [v * 0.88 for v in fam[7][1]])
    alpha = verdicts.per_metric(20)
    t = stats.ttest_ind(np.log(fam[7][1]), np.log(fam[7][0])).statistic
    assert stats.t.isf(alpha, 4) > -t > stats.t.isf(alpha, 20 * 4)
    base, cur = _result([b for b, _ in fam]), _result([c for _, c in fam])

    def flagged(moderate: bool) -> list[str]:
        return [c.cell for c in compare_results([base], cur, alpha, moderate=moderate)
                if c.verdict == "regression"]

    assert flagged(True) == ["w/tiny/w2/s7/throughput"]
    assert flagged(False) == []


@pytest.mark.parametrize("nights", [False, True])
def test_the_switch_reaches_the_reports_entry_points(nights: bool) -> None:
    """``moderate=False`` through ``compare_at_rate`` and ``over_nights_at_rate`` (what
    ``scripts/moderation_gain.py`` sets side by side): every judged metric is tested on
    the cell's own degrees of freedom (3 repeats a side: 4; 5 earlier results as the
    units: 4), moderated on more (20 cells of equal noise: all but the few whose variance
    falls in the prior's outlier tail, which keep their own)."""
    rng = np.random.default_rng(31)
    results = [_result([list(1000 * np.exp(0.04 * rng.standard_normal(3))) for _ in range(20)])
               for _ in range(7 if nights else 2)]

    def dfs(moderate: bool) -> list[float]:
        changes = (regressions.over_nights_at_rate(results[:-1], results[-1], 5,
                                                   moderate=moderate) if nights else
                   regressions.compare_at_rate(results[:1], results[1], moderate=moderate))[0]
        return [c.df for c in regressions.judged(changes)]

    assert dfs(False) == [4] * 20
    assert sum(df > 4 for df in dfs(True)) >= 15


def _night_shifts(rng: np.random.Generator, cells: int, nights: int, rho: float
                  ) -> np.ndarray:
    """Each cell's shift on each night (deviation 1): a part ``rho`` of its variance shared
    by every cell that night (the machine's), the rest its own."""
    shared = rng.standard_normal(nights)[None, :]
    return math.sqrt(rho) * shared + math.sqrt(1 - rho) * rng.standard_normal((cells, nights))


def test_effective_cells_is_kish_s_design_effect() -> None:
    """Independent cells count as about themselves (the estimate errs low), cells that move
    as one as one, and cells sharing a part rho of their noise as about Kish's
    G / (1 + (G - 1) rho^2) (the variances of normals correlated rho are correlated
    rho^2), in the median over draws: on few nights a little more (errs high)."""
    rng = np.random.default_rng(41)
    cells, nights = 60, 5
    df = [nights - 1.0] * cells

    def devs(rho: float) -> list[list[float]]:
        x = _night_shifts(rng, cells, nights, rho)
        return [list(r - r.mean()) for r in x]

    alone = np.median([moderation.effective_cells(devs(0.0), df) for _ in range(20)])
    assert cells / 2 < alone <= cells
    same = [[1.0, -2.0, 0.5, 0.5, 0.0]] * cells
    assert moderation.effective_cells(same, df) == pytest.approx(1.0)
    got = np.median([moderation.effective_cells(devs(0.7), df) for _ in range(20)])
    kish = cells / (1 + (cells - 1) * 0.49)  # 2.0: the estimate errs high on 4 df (a
    assert kish <= got < 1.5 * kish  # sample correlation of 5 points errs low)


def test_effective_cells_edges() -> None:
    """A vector that lost an entry (a repeat or night) is left out of the correlation but
    counted among the cells; with one degree of freedom (two repeats: every cosine +-1)
    cells of random sign count as many and cells of one sign as one; with no two vectors
    alike, the cells count as one; the cap follows the count and ``cell_df``, and the
    scale does not move with the cap."""
    rng = np.random.default_rng(47)
    x = _night_shifts(rng, 30, 5, 0.0)
    devs = [list(r - r.mean()) for r in x]
    dfs = [4.0] * 30
    full = moderation.effective_cells(devs, dfs)
    shorter = [d[:4] if i < 3 else d for i, d in enumerate(devs)]
    # the 27 aligned vectors estimate the correlation, all 30 cells are counted
    assert moderation.effective_cells(shorter, dfs) == pytest.approx(full, rel=0.2)
    pairs = [[a, -a] for a in rng.choice([-1.0, 1.0], 40) * rng.uniform(0.5, 2.0, 40)]
    assert moderation.effective_cells(pairs, [1.0] * 40) > 10
    assert moderation.effective_cells([[a, -a] for a in rng.uniform(0.5, 2.0, 40)],
                                      [1.0] * 40) == pytest.approx(1.0)
    assert moderation.effective_cells([[1.0, -1.0], [1.0, 0.0, -1.0]], [1.0, 2.0]) == 1.0
    variances = [(float(np.var(d, ddof=1)), 4) for d in devs]
    alone = moderation.fit(variances)
    together = moderation.fit(variances, [devs[0]] * 30)  # every cell moving as one
    assert together.d0 == 0 and together.s0sq == pytest.approx(alone.s0sq)
    capped = moderation.fit(variances, devs, cell_df=1.0)
    assert capped.d0 <= moderation.effective_cells(devs, dfs) - 1 + 1e-9


def _history_family(rng: np.random.Generator, rho: float, cells: int = 40) -> list:
    """A family of cells judged over nights (5 earlier results of 3 repeats, tonight drawn
    alike: nothing changed; night-to-night noise 10%, a part ``rho`` of it shared)."""
    shift = 0.1 * _night_shifts(rng, cells, 6, rho)
    logs = 7 + shift[:, :, None] + 0.01 * rng.standard_normal((cells, 6, 3))
    return [([list(np.exp(r)) for r in g[:-1]], list(np.exp(g[-1]))) for g in logs]


def _fitted(family: list, correlated: bool) -> moderation.Prior:
    """The prior over the family, with the cells' deviations (as the reports fit it) or as
    if the cells were independent."""
    spreads = [verdicts.spread(b, c) for b, c in family]
    return moderation.fit([(sum(x * x for x in r) / df, df) for r, df in spreads],
                          [r for r, _ in spreads] if correlated else None)


def test_cells_that_move_together_do_not_count_as_many() -> None:
    """Nights on which the machine moves every cell alike (90% of the night-to-night noise
    shared; raw throughput's nights on this machine move together so): the cells agree,
    so as if independent the prior would take d0 near its cap and each cell's t a
    critical value near the normal's, while each cell knows only its own few nights
    (above the rate at small rates); counted by their deviations' correlation, d0 stays
    small and unchanged cells flag at the rate (their flags move together: the tolerance
    is over families)."""
    rng, alpha = np.random.default_rng(43), 0.01
    family = _history_family(rng, 0.9)
    assert _fitted(family, False).d0 > 50
    assert _fitted(family, True).d0 < 5
    shares = []
    for _ in range(300):
        family = _history_family(rng, 0.9)
        prior = _fitted(family, True)
        shares.append(np.mean([verdicts.test(b, c, True, alpha, prior=prior).verdict
                               == "regression" for b, c in family]))
    assert np.mean(shares) < alpha + 4 * np.std(shares, ddof=1) / math.sqrt(len(shares))


def _gain_runs(tmp_path, seed: int, names: list[str]) -> None:  # noqa: ANN001
    """One suite result file per name, a day apart, each of 12 cells of equal, independent
    noise (3 repeats)."""
    import json

    rng = np.random.default_rng(seed)
    for i, name in enumerate(names):
        result = _result([list(1000 * np.exp(0.05 * rng.standard_normal(3)))
                          for _ in range(12)])
        result["environment"]["git_sha"] = f"sha{i}"
        result["created"] = f"2026-01-{i + 1:02d}T00:00:00+00:00"
        (tmp_path / name).write_text(json.dumps(result))


def test_the_gain_script_sets_both_rules_side_by_side(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """``scripts/moderation_gain.py`` on three results of 12 cells of equal, independent
    noise: both rules on each pair, the moderated median MDC the lower (the cells'
    agreement is information each cell alone lacks), and the fitted priors listed."""
    import sys

    from tests.scripts import load_script

    script = load_script("moderation_gain")
    _gain_runs(tmp_path, 53, [f"r{i}.json" for i in range(3)])
    out = tmp_path / "gain.md"
    monkeypatch.setattr(sys, "argv", ["moderation_gain.py", "--runs",
                                      str(tmp_path / "r*.json"), "-o", str(out)])
    script.main()
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line.split("|")[4].strip()
            for line in out.read_text().splitlines() if line.startswith("| A")}
    assert set(rows) == {(f"A{i} vs A{i + 1}", m) for i in (1, 2) for m in ("no", "yes")}
    for i in (1, 2):
        assert float(rows[f"A{i} vs A{i + 1}", "yes"].rstrip("%")) < float(
            rows[f"A{i} vs A{i + 1}", "no"].rstrip("%"))
    assert "| last pair | throughput_samples_per_s | repeats | 12 |" in out.read_text()


def test_the_gain_script_judges_a_night_on_the_runs_before_it(tmp_path, monkeypatch
                                                               ) -> None:  # noqa: ANN001
    """A night that is also one of ``--runs`` (the committed nightly is the last A run) is
    judged on the runs made before it, not on itself: its rows equal those of the same
    night given apart from runs that stop before it."""
    import sys

    from tests.scripts import load_script

    script = load_script("moderation_gain")
    _gain_runs(tmp_path, 59, [f"r{i}.json" for i in range(4)] + ["night.json"])

    def night_rows(runs: str) -> list[str]:
        out = tmp_path / "gain.md"
        monkeypatch.setattr(sys, "argv", ["moderation_gain.py", "--runs", runs, "--history",
                                          str(tmp_path / "night.json"), "-o", str(out)])
        script.main()
        return [line for line in out.read_text().splitlines()
                if line.startswith(("| night", "| night vs"))]

    apart = night_rows(str(tmp_path / "r*.json"))
    assert len(apart) > 2  # both rules' rows and the night's priors
    assert night_rows(str(tmp_path / "*.json")) == apart


def test_the_gain_script_orders_the_runs_by_when_they_ran(tmp_path, monkeypatch
                                                          ) -> None:  # noqa: ANN001
    """The same four runs named so that their names sort as they ran (r1..r4) and not
    (r9, r10, r11, r12: r10 sorts first) give the same report rows: A1 is the first run."""
    import sys

    from tests.scripts import load_script

    script = load_script("moderation_gain")

    def rows(names: list[str]) -> list[str]:
        where = tmp_path / names[0].removesuffix(".json")
        where.mkdir()
        _gain_runs(where, 61, names)
        out = where / "gain.md"
        monkeypatch.setattr(sys, "argv", ["moderation_gain.py", "--runs",
                                          str(where / "r*.json"), "-o", str(out)])
        script.main()
        return [line for line in out.read_text().splitlines() if line.startswith("| ")]

    assert rows([f"r{i}.json" for i in (9, 10, 11, 12)]) == rows(
        [f"r{i}.json" for i in (1, 2, 3, 4)])


def _noisy_cell_flags(rng: np.random.Generator, trials: int, alpha: float) -> float:
    """The share of trials in which the one cell 8 times noisier than 30 quiet ones (3
    repeats a side, nothing changed) is flagged, the prior fitted over all 31."""
    true = np.full(31, 0.05 ** 2)
    true[0] = 0.4 ** 2
    return float(np.mean([_judge(_family(rng, 31, true, 3), alpha)[0].verdict == "regression"
                          for _ in range(trials)]))


def test_a_cell_far_noisier_than_the_rest_keeps_its_own_noise(monkeypatch) -> None:  # noqa: ANN001
    """Pulled toward quiet cells, a very noisy one would flag far above the rate; beyond
    the prior's upper ``OUTLIER`` tail it is judged on its own noise, at the rate (its
    own t test is exact whatever the other cells)."""
    alpha, trials = 0.01, 400
    tol = 4 * math.sqrt(alpha * (1 - alpha) / trials)
    guarded = _noisy_cell_flags(np.random.default_rng(59), trials, alpha)
    assert guarded < alpha + tol
    monkeypatch.setattr(moderation, "OUTLIER", 0.0)  # never beyond: pulled in like the rest
    pulled = _noisy_cell_flags(np.random.default_rng(59), trials, alpha)
    assert pulled > alpha + tol
