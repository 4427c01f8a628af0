"""harness/reporting/regressions.py: a planted regression is flagged, an identical result
is not, exact counters are flagged at any size, moves inside the noise are not."""

from __future__ import annotations

import copy
import math

import pytest
from scipy import stats

from harness.reporting.regressions import compare_results, has_regression, over_nights
from harness.reporting.results import SCHEMA, summarise
from harness.reporting.verdicts import ALPHA, POWER


def _cell(key: str, thr: list[float], bytes_per_sample: float = 1000.0,
          status: str = "ok") -> dict:
    return {"key": key, "status": status, "note": "",
            "metrics": {"throughput_samples_per_s": summarise(thr).to_json(),
                        "peak_memory_bytes_max": summarise([2e8] * len(thr)).to_json()},
            "counters": {"bytes_per_sample": bytes_per_sample, "num_parameters": 650_000,
                         "steps_per_epoch": 16, "actions_per_epoch": 160.0},
            "counters_consistent": True}


def _result(cells: list[dict], created: str = "2026-01-01T00:00:00+00:00") -> dict:
    return {"schema": SCHEMA, "created": created, "suite": {"name": "t"},
            "environment": {"machine": "m"}, "cells": cells}


BASE = _result([_cell("vgg16/tiny/w2/pipedream/throughput", [100.0, 102.0, 98.0]),
                _cell("vgg16/tiny/w2/ddp/throughput", [80.0, 81.0, 79.0])])


def _verdicts(changes) -> dict:  # noqa: ANN001
    return {(c.cell.split("/")[3], c.name): c.verdict for c in changes
            if c.verdict != "changed-within-noise" and not c.verdict.startswith("not judged")}


def test_an_identical_result_is_no_regression() -> None:
    changes = compare_results([BASE], copy.deepcopy(BASE))
    assert not has_regression(changes)
    assert _verdicts(changes) == {}


def test_a_planted_throughput_drop_is_flagged_and_a_rise_is_an_improvement() -> None:
    cur = copy.deepcopy(BASE)
    cur["cells"][0] = _cell(cur["cells"][0]["key"], [80.0, 81.0, 79.0])  # -20%
    cur["cells"][1] = _cell(cur["cells"][1]["key"], [100.0, 101.0, 99.0])  # +25%
    changes = compare_results([BASE], cur)
    assert has_regression(changes)
    assert _verdicts(changes) == {("pipedream", "throughput_samples_per_s"): "regression",
                                  ("ddp", "throughput_samples_per_s"): "improvement"}
    drop = next(c for c in changes if c.verdict == "regression")
    # geometric means: (80 x 81 x 79)^(1/3) / (100 x 102 x 98)^(1/3) - 1
    assert drop.change == pytest.approx((80 * 81 * 79 / (100 * 102 * 98)) ** (1 / 3) - 1)
    # the move flagged at alpha: t(1 - alpha, 4 df) standard errors of the pooled logs
    logs = [[math.log(v) for v in g] for g in ([100.0, 102.0, 98.0], [80.0, 81.0, 79.0])]
    ss = sum((x - sum(g) / 3) ** 2 for g in logs for x in g)
    se = math.sqrt(ss / 4) * math.sqrt(2 / 3)
    assert drop.threshold == pytest.approx(math.exp(stats.t.ppf(1 - ALPHA, 4) * se) - 1)
    assert drop.mdc == pytest.approx(
        math.exp((stats.t.ppf(1 - ALPHA, 4) + stats.t.ppf(POWER, 4)) * se) - 1)


def test_a_move_inside_the_measured_spread_is_not_flagged() -> None:
    noisy = _result([_cell("vgg16/tiny/w2/pipedream/throughput", [80.0, 100.0, 120.0])])
    cur = _result([_cell("vgg16/tiny/w2/pipedream/throughput", [75.0, 88.0, 100.0])])  # -12%
    assert not has_regression(compare_results([noisy], cur))
    # the same -12% with tight repeats is a regression
    tight = _result([_cell("vgg16/tiny/w2/pipedream/throughput", [99.0, 100.0, 101.0])])
    cur = _result([_cell("vgg16/tiny/w2/pipedream/throughput", [87.0, 88.0, 89.0])])
    assert has_regression(compare_results([tight], cur))


def test_counters_must_match_exactly() -> None:
    for name, value in (("bytes_per_sample", 1001.0), ("num_parameters", 650_001),
                        ("actions_per_epoch", 161.0)):
        cur = copy.deepcopy(BASE)
        cur["cells"][1]["counters"][name] = value
        changes = compare_results([BASE], cur)
        assert _verdicts(changes) == {("ddp", name): "regression"}


def test_layout_counters_are_judged_only_between_cells_of_one_layout() -> None:
    """A layout moved by the suite's profile (a split, or the planner's replicas) changes
    bytes and actions but is no regression of the code: listed, not judged; every other
    counter, and the counters of an unmoved layout, must still match exactly."""
    base, cur = copy.deepcopy(BASE), copy.deepcopy(BASE)
    base["cells"][0].update(config="1-1", split="0-16|16-40")
    cur["cells"][0].update(config="1-1", split="0-14|14-40")
    cur["cells"][0]["counters"]["bytes_per_sample"] = 1300.0
    changes = compare_results([base], cur)
    assert not has_regression(changes)
    moved = next(c for c in changes if c.name == "bytes_per_sample")
    assert moved.verdict == "not judged (layout 1-1 0-16|16-40 -> 1-1 0-14|14-40)"
    replicated = copy.deepcopy(cur)
    replicated["cells"][0].update(config="2", split="0-40")
    replicated["cells"][0]["counters"]["actions_per_epoch"] = 64.0
    assert _verdicts(compare_results([base], replicated)) == {}
    cur["cells"][0]["counters"]["num_parameters"] = 650_001
    assert _verdicts(compare_results([base], cur)) == {
        ("pipedream", "num_parameters"): "regression"}
    same = copy.deepcopy(base)
    same["cells"][0]["counters"]["bytes_per_sample"] = 1300.0
    assert _verdicts(compare_results([base], same)) == {
        ("pipedream", "bytes_per_sample"): "regression"}


def test_a_cell_that_ran_and_now_fails_is_a_regression_a_new_one_is_not() -> None:
    cur = copy.deepcopy(BASE)
    cur["cells"][0].update(status="failed", note="rank 1 died")
    cur["cells"].append(_cell("gnmt8/tiny/w2/ddp/throughput", [50.0]))
    changes = compare_results([BASE], cur)
    assert _verdicts(changes) == {("pipedream", "status"): "regression",
                                  ("ddp", "cell"): "new"}
    removed = _result([BASE["cells"][0]])
    assert not has_regression(compare_results([BASE], removed))


def test_history_pools_the_repeats_of_every_baseline() -> None:
    """Three nights at 100, 110 and 90: from three results on each is one value, and a
    night at 85 lies inside their prediction interval; against the single night at 100
    alone (whose repeats agree exactly) it is a regression."""
    nights = [_result([_cell("k/x/w2/pipedream/throughput", [v, v, v])]) for v in
              (100.0, 110.0, 90.0)]
    cur = _result([_cell("k/x/w2/pipedream/throughput", [85.0, 85.0, 85.0])])
    assert not has_regression(compare_results(nights, cur))
    assert has_regression(compare_results(nights[:1], cur))


def test_counters_compare_with_the_newest_baseline_in_which_the_cell_ran() -> None:
    failed_night = copy.deepcopy(BASE)
    failed_night["cells"][0].update(status="failed", metrics={}, counters={})
    assert not has_regression(compare_results([BASE, failed_night], copy.deepcopy(BASE)))


def test_reaching_the_target_less_often_is_a_regression() -> None:
    def ttt(reached: int) -> dict:
        c = _cell("vgg16/tiny/w2/ddp/time-to-target", [80.0, 81.0, 79.0])
        c.update(mode="time-to-target", reached=reached, run_ids=["a", "b", "c"])
        return c

    changes = compare_results([_result([ttt(3)])], _result([ttt(1)]))
    assert _verdicts(changes) == {("ddp", "target reached"): "regression"}
    assert not has_regression(compare_results([_result([ttt(1)])], _result([ttt(3)])))


def _drift_cell(key: str, thr: list[float], ref: list[float]) -> dict:
    c = _cell(key, thr)
    c["metrics"]["reference_iterations_per_s"] = summarise(ref).to_json()
    c["metrics"]["throughput_per_reference"] = summarise(
        [t / r for t, r in zip(thr, ref, strict=True)]).to_json()
    return c


def test_a_slower_machine_is_not_a_regression_of_ours_but_a_slower_system_is() -> None:
    """The machine drifts by up to 15% between repeats; the reference drifts with it, so
    throughput per reference is the stabler figure and is judged: a night on which the
    whole machine is 20% slower passes, a system 20% slower on a steady machine does not."""
    key = "vgg16/tiny/w2/pipedream/throughput"
    speed = [1.0, 0.85, 1.1, 0.95]
    base = _result([_drift_cell(key, [100 * s * f for s, f in zip(speed, (1, 1.01, 0.99, 1),
                                                                  strict=True)],
                                [50 * s for s in speed])])
    slow_machine = _result([_drift_cell(key, [80 * s for s in speed[:3]],
                                        [40 * s for s in speed[:3]])])
    changes = compare_results([base], slow_machine)
    assert not has_regression(changes)
    raw = next(c for c in changes if c.name == "throughput_samples_per_s")
    assert raw.verdict == "not judged (throughput_per_reference stabler)"
    slow_system = _result([_drift_cell(key, [80 * s for s in speed[:3]],
                                       [50 * s for s in speed[:3]])])
    assert _verdicts(compare_results([base], slow_system)) == {
        ("pipedream", "throughput_per_reference"): "regression"}


def test_where_the_reference_moved_the_drift_cancelled_figure_is_judged() -> None:
    """The fifth nightly A/A run (``results/nightly-aa.md``): a day later the whole machine
    ran at about half speed, steadily within the night. The raw figure was the stabler
    within each night, so it was judged and flagged; the reference moved with the
    machine, so now the drift-cancelled figure is judged, and it did not move. On a
    steady machine (the reference still) the stabler raw figure stays the one judged, and
    a slower system is flagged on it."""
    key = "vgg16/tiny/w2/pipedream/throughput"
    wobble = [1.0, 1.01, 0.99, 1.0]  # raw steady; the reference noisier within a night
    ref = [1.0, 0.93, 1.07, 1.0]
    base = _result([_drift_cell(key, [100 * w for w in wobble], [50 * r for r in ref])])
    half = _result([_drift_cell(key, [55 * w for w in wobble], [27.5 * r for r in ref])])
    changes = compare_results([base], half)
    assert not has_regression(changes)
    raw = next(c for c in changes if c.name == "throughput_samples_per_s")
    assert raw.verdict == ("not judged (throughput_per_reference judged: the drift "
                           "reference moved)")
    slower = _result([_drift_cell(key, [90 * w for w in wobble], [50 * r for r in ref])])
    assert _verdicts(compare_results([base], slower)) == {
        ("pipedream", "throughput_samples_per_s"): "regression"}


def test_cpu_per_sample_on_a_slower_machine_is_judged_in_reference_iterations() -> None:
    """The same fifth A/A run: CPU seconds per sample rose about 1.8x in most cells, with
    the reference slower by as much (a slower core takes longer for the same work). Its
    drift-cancelled twin (seconds x the reference's iterations/s) is judged where the
    reference moved and did not move; a system taking 25% more CPU on a steady machine
    is flagged."""
    key = "vgg16/tiny/w2/pipedream/throughput"
    wobble, ref = [1.0, 1.01, 0.99, 1.0], [1.0, 0.93, 1.07, 1.0]

    def cell(cpu: float, speed: float) -> dict:
        cpus, speeds = [cpu * w for w in wobble], [speed * r for r in ref]
        c = _drift_cell(key, [100.0] * 4, speeds)
        c["metrics"]["cpu_s_per_sample"] = summarise(cpus).to_json()
        c["metrics"]["cpu_reference_per_sample"] = summarise(
            [x * v for x, v in zip(cpus, speeds, strict=True)]).to_json()
        return c

    base = _result([cell(0.01, 50.0)])
    changes = compare_results([base], _result([cell(0.018, 50.0 / 1.8)]))
    assert not has_regression(changes)
    raw = next(c for c in changes if c.name == "cpu_s_per_sample")
    assert raw.verdict == ("not judged (cpu_reference_per_sample judged: the drift "
                           "reference moved)")
    assert _verdicts(compare_results([base], _result([cell(0.0125, 50.0)]))) == {
        ("pipedream", "cpu_s_per_sample"): "regression"}


@pytest.mark.parametrize(("sd_raw", "sd_ref", "drift"), [
    (0.03, 0.10, 1.0),  # a noisy reference, a steady system: the reference moves alone
    (0.10, 0.02, 1.0),  # a noisy system, a steady reference
    (0.03, 0.03, 0.5),  # the whole machine at half speed on the current night
])
def test_a_drift_pair_is_flagged_at_alpha_at_most_whichever_twin_is_judged(
        sd_raw: float, sd_ref: float, drift: float) -> None:
    """Simulated pairs of results of unchanged code (4 repeats against 3, lognormal noise):
    the machine's speed multiplies the system and the reference alike, so nothing of ours
    moved. Whichever twin the rule judges, and however it chose, the pair is flagged a
    regression at no more than its level (binomial tolerance). The choice looks at the
    reference's current values, which are the drift-cancelled figure's denominator; the
    raw figure must break too, else a reference moving alone is flagged."""
    import random

    alpha, trials, rng = 0.05, 4000, random.Random(int(sd_raw * 1000 + sd_ref * 100))
    key = "vgg16/tiny/w2/pipedream/throughput"

    def night(n: int, speed: float) -> dict:
        raw = [100 * speed * math.exp(rng.gauss(0, sd_raw)) for _ in range(n)]
        ref = [50 * speed * math.exp(rng.gauss(0, sd_ref)) for _ in range(n)]
        return _result([_drift_cell(key, raw, ref)])

    flagged = sum(has_regression(compare_results([night(4, 1.0)], night(3, drift), alpha))
                  for _ in range(trials))
    # (judging the drift-cancelled twin alone where the reference moved gave 0.07 in the
    # first case: 2.5% more, the reference's own upward moves)
    assert flagged / trials < alpha + 3 * math.sqrt(alpha * (1 - alpha) / trials)


def _night(day: int, pipedream: list[float], bytes_per_sample: float = 1000.0) -> dict:
    return _result([_cell("vgg16/tiny/w2/pipedream/throughput", pipedream, bytes_per_sample),
                    _cell("vgg16/tiny/w2/ddp/throughput", [80.0, 81.0, 79.0])],
                   f"2026-01-{day:02d}T00:00:00+00:00")


def test_over_nights_one_broken_night_is_suspicious_two_are_a_regression() -> None:
    """PyTorch HUD's rule: tonight and last night are each judged against the nights
    before last night; a drop on one night is suspicious, on two in a row a regression;
    exact counters are regressions at once; a history too short is insufficient data."""
    ok = [100.0, 102.0, 98.0]
    low = [80.0, 81.0, 79.0]
    steady = [_night(1, ok), _night(2, [101.0, 99.0, 100.0])]

    def verdict(history: list[dict], tonight: dict) -> str:
        ch = over_nights(history, tonight, window=2)
        return next(c.verdict for c in ch if c.name == "throughput_samples_per_s"
                    and "pipedream" in c.cell)

    assert verdict([*steady, _night(3, ok)], _night(4, low)) == "suspicious"
    assert verdict([*steady, _night(3, low)], _night(4, low)) == "regression"
    assert verdict([*steady, _night(3, low)], _night(4, ok)) == "changed-within-noise"
    assert verdict(steady[:1], _night(4, low)) == "insufficient data"
    assert not has_regression(over_nights([*steady, _night(3, ok)], _night(4, low), 2))
    counters = over_nights(steady[:1], _night(4, ok, bytes_per_sample=1001.0), 2)
    assert has_regression(counters)  # exact counters: no second night needed


def test_over_nights_judges_exactly_one_of_each_drift_pair() -> None:
    """Which of raw and drift-cancelled throughput is judged is decided on the nights the
    verdict is judged against; last night's move must not make the full window pick the
    other twin, leaving neither judged (found when a planted drop went unflagged)."""
    key = "vgg16/tiny/w2/pipedream/throughput"
    speed = [1.0, 0.85, 1.1, 0.95]
    # the window before last night: the machine drifts, the reference follows (per
    # reference stabler); last night the raw figure is steady and the reference noisy
    drifting = [_drift_cell(key, [100 * s for s in speed], [50 * s for s in speed])]
    quiet_raw = [_drift_cell(key, [100.0, 100.5, 99.5, 100.0],
                             [50 * s for s in (1.0, 0.7, 1.3, 0.9)])]
    history = [_result(drifting, "2026-01-01T00:00:00+00:00"),
               _result(drifting, "2026-01-02T00:00:00+00:00"),
               _result(quiet_raw, "2026-01-03T00:00:00+00:00")]
    tonight = _result(quiet_raw, "2026-01-04T00:00:00+00:00")
    judged = [c.name for c in over_nights(history, tonight, window=3)
              if c.name in ("throughput_samples_per_s", "throughput_per_reference")
              and not c.verdict.startswith("not judged")]
    assert judged == ["throughput_per_reference"]  # the twin the earlier nights chose


def test_over_nights_a_drop_on_two_nights_is_a_regression_whichever_twin_each_judged() -> None:
    """Last night the system dropped 20% on a steady machine (the stabler raw figure is
    judged); tonight the drop lasts and the whole machine is also 30% slower, so the
    reference moved and the drift-cancelled twin is judged. Two nights beyond the rule
    are a regression, though each night judged a different twin."""
    key = "vgg16/tiny/w2/pipedream/throughput"
    wobble, ref = [1.0, 1.01, 0.99, 1.0], [1.0, 0.95, 1.05, 1.0]

    def night(day: int, system: float, machine: float) -> dict:
        return _result([_drift_cell(key, [100 * system * machine * w for w in wobble],
                                    [50 * machine * r for r in ref])],
                       f"2026-01-{day:02d}T00:00:00+00:00")

    history = [night(1, 1.0, 1.0), night(2, 1.0, 1.0), night(3, 0.8, 1.0)]
    changes = over_nights(history, night(4, 0.8, 0.7), window=2)
    judged = {c.name: c.verdict for c in changes if c.name.startswith("throughput")}
    assert judged["throughput_per_reference"] == "regression"
    assert judged["throughput_samples_per_s"].startswith("not judged")


def test_results_run_with_other_runtime_switches_say_so() -> None:
    from harness.reporting.change_report import switches_differ

    def ran_with(env: str | None) -> dict:
        return {"environment": {"machine": "m"} if env is None else
                {"machine": "m", "runtime_env": env}, "cells": []}

    assert switches_differ([ran_with("defaults")], ran_with("defaults")) == []
    line, blank = switches_differ([ran_with("defaults")], ran_with("PIPEBENCH_PIN=1"))
    assert "the baseline ran with defaults, the current result with PIPEBENCH_PIN=1" in line
    assert blank == ""
    assert switches_differ([ran_with(None)], ran_with("PIPEBENCH_PIN=1")) == []  # older


STEADY = "steady_samples_per_s"


def _with_steady(result: dict, values: list[float], new: bool) -> dict:
    """``result`` with every cell's steady throughput at ``values``, recording today's
    definitions (``new``) or none (a result made before the field existed)."""
    from harness.reporting.results import DEFINITIONS
    out = copy.deepcopy(result)
    for c in out["cells"]:
        c["metrics"][STEADY] = summarise(values).to_json()
    if new:
        out["definitions"] = dict(DEFINITIONS)
    return out


def test_a_figure_is_not_compared_across_a_changed_definition() -> None:
    # the steady throughput's definition changed (results.DEFINITIONS): a baseline made
    # before, 20% above tonight's, is no regression of it, and is judged again once both
    # sides record the same version
    from harness.reporting.results import DEFINITIONS, comparable
    name = STEADY
    assert DEFINITIONS[name] == 2
    old = _with_steady(BASE, [120.0, 121.0, 119.0], False)
    cur = _with_steady(BASE, [100.0, 101.0, 99.0], True)
    assert all(name not in c["metrics"] for c in comparable([old], cur)[0]["cells"])
    assert all("throughput_samples_per_s" in c["metrics"]
               for c in comparable([old], cur)[0]["cells"])
    changes = compare_results([old], cur)
    assert not has_regression(changes)
    assert [(c.verdict, c.current) for c in changes if c.name == name] == \
        [("not judged (its definition changed)", 100.0)] * 2  # listed, not judged
    same = _with_steady(BASE, [120.0, 121.0, 119.0], True)
    assert _verdicts(compare_results([same], cur))[("pipedream", name)] == "regression"
    assert comparable([same], cur)[0] is same  # nothing to leave out: the result itself


def test_over_nights_counts_only_the_nights_of_the_same_definition() -> None:
    # two nights under the steady figure's old definition, then one under the new: tonight
    # and last night both 20% below that one night break against its repeats, but one
    # night is too short a history to label (verdicts.MIN_HISTORY), whatever came before
    name = STEADY

    def night(day: int, values: list[float], new: bool) -> dict:
        return _with_steady(_night(day, [100.0, 102.0, 98.0]), values, new)

    ok, low = [100.0, 102.0, 98.0], [80.0, 81.0, 79.0]
    history = [night(1, ok, False), night(2, ok, False), night(3, ok, True),
               night(4, low, True)]
    changes = over_nights(history, night(5, low, True), window=3)
    got = {c.cell.split("/")[3]: c.verdict for c in changes if c.name == name}
    assert got["pipedream"] == "insufficient data"
    # the same nights all under the new definition: a regression
    same = [night(d, v, True) for d, v in ((1, ok), (2, ok), (3, ok), (4, low))]
    changes = over_nights(same, night(5, low, True), window=3)
    assert {c.verdict for c in changes if c.name == name and "pipedream" in c.cell} == \
        {"regression"}
