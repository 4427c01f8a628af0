"""scripts/nightly_power.py's arithmetic, checked against numbers derived here by hand.

Why: the script writes results/nightly-power.md, nightly-aa.md and smoke-aa.md, whose trade
line (cell runs for a 10% MDC), false alarms by metric, repeats each cell needs and
nightly labels are read as the detector's measured error rates and cost; a slip in them
reads as a fact about the detector. Each expected value below comes from a closed form
or from counting, never from the script's own code; the suite runs are built by hand
(one to three cells, one throughput figure), so nothing is benchmarked.
"""

from __future__ import annotations

import math

import pytest
from scipy import stats

from harness.reporting.regressions import Change
from harness.reporting.results import SCHEMA, summarise
from tests.scripts import SCRIPTS, load_script

np_ = load_script("nightly_power")

THR, PER_REF = "throughput_samples_per_s", "throughput_per_reference"
STEADY, STEADY_REF = "steady_samples_per_s", "steady_per_reference"


# --- _budget: the trade line ------------------------------------------------------------

def test_budget_counts_each_cell_at_the_larger_of_the_suite_repeats_and_its_need() -> None:
    # 3 repeats a cell; cells needing 2, 5 and 10 (one with no estimate): now 3 x 3 = 9
    # cell runs, then 3 (2 < 3) + 5 + 10 = 18, twice the time
    assert np_._budget(3, [2, 5, None, 10]) == (
        "The trade: 3 cells have a noise estimate; run with 3 repeats they make 9 cell "
        "runs, and with the repeats each needs for a 10% MDC (at least 3) 18 (2.0x the "
        "time).")
    # every need under the suite's repeats: nothing more to run
    assert "make 10 cell runs" in np_._budget(5, [2, 3]) and "10 (1.0x" in np_._budget(5, [2, 3])


def test_budget_brute_force_count_of_cell_runs() -> None:
    """Count the runs one by one: a cell needing n runs max(repeats, n) times."""
    needs = [2, 7, None, 4, 13, 3, None, 6]
    for repeats in (1, 3, 5, 20):
        runs = [(cell, i) for cell, n in enumerate(needs) if n is not None
                for i in range(repeats if n < repeats else n)]
        now = [(cell, i) for cell, n in enumerate(needs) if n is not None
               for i in range(repeats)]
        text = np_._budget(repeats, needs)
        assert f"make {len(now)} cell runs" in text
        assert f"(at least {repeats}) {len(runs)} ({len(runs) / len(now):.1f}x" in text


def test_budget_without_any_noise_estimate() -> None:
    assert np_._budget(1, [None, None]) == (
        "The trade: no cell has a noise estimate (1 repeat(s) a cell), so pair mode judges "
        "only exact counters and failures here.")
    assert "no cell has a noise estimate" in np_._budget(1, [])


def test_budget_cells_too_noisy_for_any_repeats_are_counted_as_estimated() -> None:
    """A cell needing over 1000 repeats has a noise estimate (found: where every cell did,
    the line said that none had one); where others can be budgeted, it is added apart."""
    alone = np_._budget(5, [math.inf, math.inf, None])
    assert "no cell has a noise estimate" not in alone
    assert alone.startswith("The trade: 2 cells have a noise estimate, and each would "
                            "need over 1000 repeats a side")
    mixed = np_._budget(4, [6, math.inf, None])
    assert mixed.startswith("The trade: 1 cells have a noise estimate; run with 4 repeats "
                            "they make 4 cell runs")
    assert "(at least 4) 6 (1.5x the time); 1 more cells have a noise estimate but would " \
           "need over 1000 repeats a side." in mixed


# --- _by_metric: false alarms tallied by metric -----------------------------------------

def _flag(cell: str, name: str, change: float | None, verdict: str = "regression") -> Change:
    return Change(cell, name, verdict, change=change)


def _rows(lines: list[str]) -> list[list[str]]:
    return [line.strip("| ").split(" | ") for line in lines if line.startswith("| A")]


def test_by_metric_counts_flags_per_pair_and_metric_most_first() -> None:
    pair1 = [_flag("d", "cpu_s_per_sample", 0.5), _flag("a", "peak_memory_bytes_max", -0.05),
             _flag("e", "cpu_s_per_sample", 0.3, "improvement"),
             _flag("b", "peak_memory_bytes_max", -0.07),
             _flag("a", THR, 0.01, "changed-within-noise"),  # not a flag
             _flag("a", PER_REF, -0.3, f"not judged ({THR} stabler)"),  # not judged
             _flag("c", "peak_memory_bytes_max", -0.06), _flag("f", "status", None)]
    pair3 = [_flag(f"c{k}", THR, k / 100, "improvement") for k in (3, 1, 5, 2, 4)]
    lines = np_._by_metric([(1, pair1), (2, [_flag("a", THR, 0.0, "changed-within-noise")]),
                            (3, pair3)])
    assert lines[0] == "False alarms by metric:"
    # peak memory: 3 flags, moves -7, -6, -5 (median -6); cpu: 2, +30 and +50 (median +40);
    # the failed cell: 1, no move; pair 2 flagged nothing; pair 3: 5 cells, +1 to +5
    assert _rows(lines) == [
        ["A1 vs A2", "peak_memory_bytes_max", "3", "-6.0% (-7.0 to -5.0)", "a, b, c"],
        ["A1 vs A2", "cpu_s_per_sample", "2", "+40.0% (+30.0 to +50.0)", "d, e"],
        ["A1 vs A2", "status", "1", "n/a", "f"],
        ["A3 vs A4", THR, "5", "+3.0% (+1.0 to +5.0)", "5 cells"]]


def test_by_metric_says_nothing_without_flags() -> None:
    quiet = [_flag("a", THR, 0.01, "changed-within-noise"), _flag("a", "x", None, "new")]
    assert np_._by_metric([(1, quiet), (2, [])]) == []


# --- the repeats for 10%: _judged, _repeats_for, _need_text ------------------------------

LEVEL = 0.001  # the level per metric the pair is tested at (an input of _repeats_for)


def _sd_star(n: int, level: float = LEVEL) -> float:
    """The largest noise (deviation of the logs) whose MDC at n repeats a side is 10%:
    (t_{1-level} + t_{POWER}) * sd * sqrt(2/n) = log(1.1), df = 2n - 2, where the 2% floor
    does not bind (checked)."""
    df = 2 * n - 2
    t_a, t_p = stats.t.ppf(1 - level, df), stats.t.ppf(0.9, df)
    sd = math.log(1.1) / ((t_a + t_p) * math.sqrt(2 / n))
    assert t_a * sd * math.sqrt(2 / n) > math.log(1.02)  # the floor does not bind here
    return sd


def _cell_with(**sds: float | None) -> dict:
    """A cell whose metric NAME has three values with logs -sd, 0, sd (deviation sd
    exactly), or one value (None: no noise estimate)."""
    def values(sd: float | None) -> list[float]:
        return [100.0] if sd is None else [100 * math.exp(x) for x in (-sd, 0.0, sd)]
    return {"key": "k", "metrics": {n: {"values": values(sd)} for n, sd in sds.items()}}


@pytest.mark.parametrize("n", [2, 3, 5, 8, 20, 100])
def test_repeats_for_is_the_first_n_whose_mdc_reaches_10_percent(n: int) -> None:
    edge = _sd_star(n)
    assert np_._repeats_for(_cell_with(**{THR: edge * (1 - 1e-6)}), [THR], LEVEL) == n
    assert np_._repeats_for(_cell_with(**{THR: edge * (1 + 1e-6)}), [THR], LEVEL) == n + 1
    # at a suite's smaller level per metric the same noise needs more
    strict = _sd_star(n, 0.05 / 480)
    assert np_._repeats_for(_cell_with(**{THR: strict * (1 - 1e-6)}), [THR], 0.05 / 480) == n


def test_repeats_for_takes_the_stabler_judged_figure_only() -> None:
    edge5, edge12 = _sd_star(5), _sd_star(12)
    cell = _cell_with(**{THR: 0.5, STEADY: edge5 * 0.999,  # judged: the stabler wins
                         PER_REF: 1e-4,  # quieter, but not judged: ignored
                         STEADY_REF: None})  # judged, one value: no estimate
    assert np_._repeats_for(cell, [STEADY, STEADY_REF, THR], LEVEL) == 5
    assert np_._repeats_for(cell, [THR, "absent"], LEVEL) == math.inf  # 0.5 > sd*(1000)
    assert np_._repeats_for(_cell_with(**{THR: edge12 * 0.999}), [THR], LEVEL) == 12
    assert np_._repeats_for(cell, [STEADY_REF], LEVEL) is None
    assert np_._repeats_for(cell, [], LEVEL) is None
    assert _sd_star(1000) < 0.5  # why 0.5 needs over 1000 a side
    # noise zero: the MDC is the 2% floor, under 10% at the fewest repeats with a df
    assert np_._repeats_for(_cell_with(**{THR: 0.0}), [THR], LEVEL) == 2
    assert [np_._need_text(v) for v in (None, math.inf, 7)] == ["-", "> 1000", "7"]


def test_judged_keeps_the_finite_mdcs_of_the_judged_throughputs_of_one_cell() -> None:
    pairs = [(1, [Change("k", THR, "changed-within-noise", mdc=0.05),
                  Change("k", PER_REF, f"not judged ({THR} stabler)", mdc=0.01),
                  Change("k", STEADY, "too-few-repeats", mdc=math.inf),
                  Change("k", STEADY_REF, "changed-within-noise", mdc=None),
                  Change("k", "cpu_s_per_sample", "changed-within-noise", mdc=0.02),
                  Change("other", STEADY, "changed-within-noise", mdc=0.03)]),
             (2, [Change("k", THR, "regression", mdc=0.07),
                  Change("k", STEADY, "changed-within-noise", mdc=0.04)])]
    assert np_._judged("k", pairs) == {THR: [0.05, 0.07], STEADY: [0.04]}
    assert np_._judged("other", pairs) == {STEADY: [0.03]}
    assert np_._judged("none", pairs) == {}


# --- history mode: _nightly_labels and its count of labellable runs ---------------------

def _run(values: dict[str, list[float]], day: int, bytes_per_sample: float = 1000.0) -> dict:
    cells = [{"key": f"vgg16/tiny/w2/{system}/throughput", "status": "ok",
              "metrics": {THR: summarise(v).to_json()},
              "counters": {"bytes_per_sample": bytes_per_sample},
              "counters_consistent": True} for system, v in values.items()]
    return {"schema": SCHEMA, "created": f"2026-01-{day:02d}T00:00:00+00:00",
            "suite": {"name": "t"}, "environment": {"machine": "m"}, "cells": cells}


def _labels(runs: list[dict]) -> tuple[list[tuple[str, str, str]], int]:
    labels, labelled = np_._nightly_labels(runs)
    return [(c.cell.split("/")[3], c.name, c.verdict) for _, c in labels], labelled


def test_nightly_labels_one_night_suspicious_two_a_regression() -> None:
    """One repeat a run: a night is labelled from 3 results before the night before (a
    pair test of single repeats has no degree of freedom), so of runs 2..7 the 5th, 6th
    and 7th; pipedream's drop on the 5th is suspicious, again on the 6th a regression, the
    7th is back within the (now wide) noise; gpipe's rise on the 6th alone is an
    improvement for one night. The control's counter moves on the 5th run: an exact
    counter is no nightly label."""
    pd = [100.0, 100.1, 99.9, 100.0, 80.0, 80.0, 100.0]
    gpipe = [60.0, 60.06, 59.94, 60.0, 60.0, 75.0, 60.0]
    ddp = [50.0, 50.05, 49.95, 50.0, 50.0, 50.0, 50.0]
    runs = [_run({"pipedream": [p], "gpipe": [g], "ddp": [d]}, k + 1,
                 1001.0 if k == 4 else 1000.0)
            for k, (p, g, d) in enumerate(zip(pd, gpipe, ddp, strict=True))]
    labels, labelled = np_._nightly_labels(runs)
    assert _labels(runs) == ([("pipedream", THR, "suspicious"),
                              ("gpipe", THR, "improvement (one night)"),
                              ("pipedream", THR, "regression")], 3)
    # tonight's result against the geometric mean of the 3 before last night
    assert [k for k, _ in labels] == [4, 5, 5]  # the 5th run, then the 6th
    assert labels[0][1].change == pytest.approx(80 / (100 * 100.1 * 99.9) ** (1 / 3) - 1)
    lines = np_._by_label(labels, labelled, len(runs))
    assert lines[0] == ("As the nightly labels them (3 of the 6 later runs had the history a "
                        "label needs):")
    assert lines[4].startswith(f"| A5 | suspicious | {THR} | 1 | -20.0% (-20.0 to -20.0) | "
                               "vgg16/tiny/w2/pipedream/throughput |")
    assert [row.split(" | ")[:2] for row in lines[4:7]] == [
        ["| A5", "suspicious"], ["| A6", "regression"], ["| A6", "improvement (one night)"]]


def test_nightly_labels_judge_on_the_window_of_make_nightly() -> None:
    """WINDOW is the history `make nightly` gives `pipebench regressions`, and a result
    more than WINDOW before the night before no longer widens the noise: the old level 50
    is in the 8th run's window only if it were 6 results or more."""
    makefile = (SCRIPTS.parent / "Makefile").read_text().splitlines()
    nightly = [line for line in makefile if "pipebench regressions" in line]
    assert len(nightly) == 2  # with and without NIGHTLY_HISTORY
    assert all("--history $(NIGHTLY_WINDOW) " in line for line in nightly)
    assert f"NIGHTLY_WINDOW := {np_.WINDOW}" in makefile
    pd = [50.0, 100.0, 100.1, 99.9, 100.0, 100.05, 99.95, 80.0]
    runs = [_run({"pipedream": [p]}, k + 1) for k, p in enumerate(pd)]
    # runs[4:8] have 3 or more results before the night before; runs[7] (80) is judged
    # on runs[1:6] (100 +- 0.1): suspicious; with the 50 in, a -20% move is noise
    assert _labels(runs) == ([("pipedream", THR, "suspicious")], 4)


@pytest.mark.parametrize("repeats", [1, 3])
def test_nightly_labels_count_the_runs_with_enough_history(repeats: int) -> None:
    """Brute-force count: run k (k = 1..n-1) is judged on min(k - 1, 5) results before the
    night before; it needs 2 of them (MIN_HISTORY), and with one repeat a result 3 (the
    night-level test; two single repeats leave no degree of freedom)."""
    need = 3 if repeats == 1 else 2
    for n in range(1, 9):
        runs = [_run({"pipedream": [100.0, 101.0, 99.0][:repeats]}, k + 1) for k in range(n)]
        labels, labelled = np_._nightly_labels(runs)
        assert labels == []  # the same values every night: nothing moved
        assert labelled == sum(1 for k in range(1, n) if min(k - 1, 5) >= need)
    assert np_._by_label([], 2, 5) == [
        "As the nightly labels them: nothing flagged (2 of the 4 later runs had the history "
        "a label needs).", ""]


def test_runs_with_other_repeats_are_refused() -> None:
    """A reused run made with other repeats would make the header's count wrong."""
    def made(n: int) -> dict:
        return {"suite": {"repeats": n}}
    np_._same_repeats([made(5), made(5)], None)
    np_._same_repeats([made(12), made(12)], 12)
    with pytest.raises(SystemExit, match=r"\[5, 12\] repeats"):
        np_._same_repeats([made(5), made(12)], None)
    with pytest.raises(SystemExit, match="not the 12 asked for"):
        np_._same_repeats([made(5), made(5)], 12)


def test_kept_runs_with_other_repeats_are_refused_before_any_run(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """With --reuse, a kept run of other repeats stops the script before it spends a
    suite run (an hour for the nightly) on a report it would then refuse."""
    (tmp_path / "aa-0.json").write_text("{}")  # kept; aa-1 is not: it would run
    monkeypatch.setattr(np_, "load_result", lambda path: {"suite": {"repeats": 5}})
    ran = []
    monkeypatch.setattr(np_, "_bench", lambda *a: ran.append(a))
    monkeypatch.setattr("sys.argv", ["nightly_power.py", "--reuse", "--repeats", "12",
                                     "--workdir", str(tmp_path), "-o", str(tmp_path / "o.md")])
    with pytest.raises(SystemExit, match="not the 12 asked for"):
        np_.main()
    assert ran == []


def test_reuse_in_an_empty_workdir_runs_everything(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """With nothing kept yet, --reuse --repeats N runs every suite run (nothing to refuse)."""
    ran = []

    def bench(suite, out, plants, reuse, repeats):  # noqa: ANN001, ANN202
        ran.append((out.name, repeats))
        raise SystemExit("stop here")  # the report is not what this test is about

    monkeypatch.setattr(np_, "_bench", bench)
    monkeypatch.setattr("sys.argv", ["nightly_power.py", "--reuse", "--repeats", "12",
                                     "--workdir", str(tmp_path), "-o", str(tmp_path / "o.md")])
    with pytest.raises(SystemExit, match="stop here"):
        np_.main()
    assert ran == [("aa-0.json", 12)]


# --- _between: the between-results noise beside the pair test's flags ---------------------

def test_between_section_ratio_by_hand_and_expected_flags_in_the_aa_section() -> None:
    """Two cells, two runs of 2 repeats each. Cell a: logs (0, 0.2) and (0.1, 0.3): the
    repeats' variance 0.02 each, so a mean varies by 0.02 / 2 = 0.01 by their count; the
    means 0.1 and 0.2 vary by 0.005. Cell b: logs (0, 0.2) and (0.5, 0.7): means 0.1 and
    0.6 vary by 0.125. Pooled: (0.005 + 0.125) / (0.01 + 0.01) = 6.5."""
    e = math.exp
    runs = [_run({"a": [1.0, e(0.2)], "b": [1.0, e(0.2)]}, 1),
            _run({"a": [e(0.1), e(0.3)], "b": [e(0.5), e(0.7)]}, 2)]
    for r in runs:
        r["suite"]["repeats"] = 2
    lines = np_._aa_section(runs[0], runs)
    start = next(i for i, s in enumerate(lines) if s.startswith("Between results"))
    assert lines[start + 4] == f"| {THR} | 6.50 | 6.50 |"
    # the pair's 2 judged metrics are each tested at the rate per comparison over 2; the
    # expected flags: each direction at the rate a ratio of 6.5 gives a pair test of 2 + 2
    # repeats (2 degrees of freedom) at that level, P(T_2 > t / sqrt(6.5))
    level = 0.05 / 2
    rate = stats.t.sf(stats.t.ppf(1 - level, 2) / math.sqrt(6.5), 2)
    assert lines[start + 10] == (f"| A1 vs A2 | 2 | {level:.2g} | 0 | {4 * level:.2f} | "
                                 f"{4 * rate:.2f} |")


def test_between_section_is_left_out_without_a_noise_estimate() -> None:
    """One repeat a run: no metric has a noise estimate (its MDC is infinite), so there
    is no ratio to give and no flag to expect."""
    runs = [_run({"a": [1.0], "b": [2.0]}, 1), _run({"a": [1.1], "b": [2.1]}, 2)]
    for r in runs:
        r["suite"]["repeats"] = 1
    assert not any(s.startswith("Between results") for s in np_._aa_section(runs[0], runs))
