"""harness/reporting/action_costs.py and scripts/action_costs.py on hand-made run metrics.

Why: these tables say in which actions one engine is slower than another on the same split
(issue 24). Every expected figure here is a division done by hand from the metrics made up
for it (what a run logs under ``metrics.ACTION_TIME``, ``ACTION_CPU``,
``ACTION_PREEMPTIONS`` and ``ACTION_FAULTS``), and the medians over repeats are taken by hand too.
"""

from __future__ import annotations

import pytest

from harness import metrics
from harness.reporting.action_costs import FIGURES, grouped, median_costs, per_action
from tests.scripts import load_script

costs_script = load_script("action_costs")


def _run(worker: int, **kinds: tuple[float, ...]) -> dict[str, float]:
    """A run's metrics: per kind (wall s, CPU s, preemptions[, faults]) over the run."""
    out: dict[str, float] = {}
    for kind, (wall, cpu, switched, *faults) in kinds.items():
        out[metrics.key(metrics.ACTION_TIME, kind=kind, worker=worker)] = wall
        out[metrics.key(metrics.ACTION_CPU, kind=kind, worker=worker)] = cpu
        out[metrics.key(metrics.ACTION_PREEMPTIONS, kind=kind, worker=worker)] = switched
        if faults:
            out[metrics.key(metrics.ACTION_FAULTS, kind=kind, worker=worker)] = faults[0]
    return out


def test_per_action_divides_by_the_minibatches_and_finds_time_off_the_core() -> None:
    run = {**_run(0, F=(0.8, 0.6, 10.0, 80.0), SF=(0.1, 0.05, 0.0)),
           **_run(1, B=(1.2, 1.2, 2.0)),
           # a kind timed but without thread use (as engines that log none): left out
           metrics.key(metrics.ACTION_TIME, kind="wait", worker=1): 5.0}
    got = per_action(run, 40)
    assert got[0]["F"] == pytest.approx(dict(zip(FIGURES, (20.0, 15.0, 5.0, 0.25, 2.0),
                                                 strict=True)))
    assert got[0]["SF"]["faults"] == 0.0  # none logged
    assert got[0]["SF"]["off core ms"] == pytest.approx(1.25)
    assert set(got[1]) == {"B"} and got[1]["B"]["off core ms"] == pytest.approx(0.0)
    groups = grouped(got)
    compute = next(g for g in groups[0] if g.startswith("compute"))
    assert groups[0][compute]["wall ms"] == pytest.approx(20.0)
    assert groups[0]["sends (SF, SB, ST)"]["CPU ms"] == pytest.approx(1.25)
    assert "sends (SF, SB, ST)" not in groups[1]  # worker 1 sent nothing here
    assert groups[0][compute]["faults"] == pytest.approx(2.0)
    old = {0: {k: {f: v for f, v in figures.items() if f != "faults"}  # kept before faults
               for k, figures in got[0].items()}}
    assert "faults" not in grouped(old)[0][compute]


def test_a_cell_keeps_each_figures_median_over_its_repeats_and_the_script_shows_it() -> None:
    repeats = [per_action(_run(0, F=(0.2, 0.2, 0.0)), 20),
               per_action(_run(0, F=(0.4, 0.2, 2.0)), 20),
               per_action(_run(0, F=(1.2, 0.3, 4.0)), 20)]
    kept = median_costs(repeats)
    # wall 10, 20, 60 ms -> 20; CPU 10, 10, 15 -> 10; off core: the medians' 20 - 10 (the
    # runs' own 0, 10, 45 have a median of 10 too, by chance; below, the runs' own 10, 10,
    # 50 have a median of 10, the medians' difference is 40 - 10)
    assert kept == {"0": {"F": pytest.approx(dict(zip(FIGURES, (20.0, 10.0, 10.0, 0.1, 0.0),
                                                      strict=True)))}}
    skewed = median_costs([per_action(_run(0, F=w_c), 20) for w_c in
                           ((0.3, 0.1, 0.0), (0.8, 0.6, 0.0), (1.2, 0.2, 0.0))])
    assert skewed["0"]["F"]["off core ms"] == pytest.approx(40.0 - 10.0)
    assert median_costs([]) == {}
    result = {"suite": {"name": "adhoc", "repeats": 3},
              "environment": {"git_sha": "abc", "hardware": "x"},
              "cells": [{"key": "vgg16/tiny/w2/pipedream-flush/throughput", "actions": kept},
                        {"key": "vgg16/tiny/w2/ddp/throughput", "actions": {}}]}
    text = costs_script.report(result, "cmd")
    assert "| 0 | F | 20.000 | 10.000 | 10.000 | 0.100 | 0.000 |" in text
    assert text.count("Not timed by action") == 1  # the ddp cell
