"""harness/reporting/dashboard.py: a cell's history band is the prediction interval of the
nights before, computed here by hand (closed form), a night that breaks it twice is marked
a regression and noise is not; the page is self-contained and draws time to accuracy only
for cells that train to a target."""

from __future__ import annotations

import math
import random
import re

import pytest
from scipy import stats

from harness import metrics
from harness.reporting.dashboard import build_dashboard, history_points
from harness.reporting.results import SCHEMA, summarise
from harness.reporting.verdicts import HISTORY_RESULTS, MIN_CHANGE, SUITE_ALPHA

KEY = "vgg16/tiny/w2/pipedream/throughput"
NAME = metrics.STEADY_THROUGHPUT


def _cell(system: str, values: list[float], mode: str = "throughput") -> dict:
    return {"key": f"vgg16/tiny/w2/{system}/{mode}", "workload": "vgg16", "scale": "tiny",
            "workers": 2, "system": system, "mode": mode, "tracking": True, "status": "ok",
            "note": "", "metrics": {NAME: summarise(values).to_json()},
            "counters": {"bytes_per_sample": 10.0}, "counters_consistent": True,
            "run_ids": [f"{system}{len(values)}"], "target": 0.5 if mode != "throughput"
            else None, "metric": "accuracy",
            "curve": {"seconds": [1.0, 2.0], "quality": [0.1, 0.6]}}


def _night(day: int, scale: float, rng: random.Random, ttt: bool = False) -> dict:
    noisy = lambda c: [c * math.exp(rng.gauss(0, 0.01)) for _ in range(4)]  # noqa: E731
    cells = [_cell("pipedream", noisy(100 * scale)), _cell("ddp", noisy(80))]
    if ttt:
        cells.append(_cell("gpipe", noisy(50), "time-to-target"))
    return {"schema": SCHEMA, "created": f"2026-11-{day:02d}T00:00:00+00:00",
            "suite": {"name": "t", "description": "d", "repeats": 4, "threads": 1},
            "environment": {"machine": "m", "git_sha": f"{day:040x}", "hardware": "cpu",
                            "torch": "2"},
            "mlflow": {"tracking_uri": "http://127.0.0.1:5000", "experiment": "e",
                       "parent_run_id": "p"},
            "cells": cells}


def _nights(slow_from: int, n: int = 8) -> list[dict]:
    rng = random.Random(7)
    return [_night(d + 1, 0.8 if d >= slow_from else 1.0, rng) for d in range(n)]


def _geo(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def test_the_band_is_the_prediction_interval_of_the_nights_it_is_judged_against() -> None:
    nights = _nights(slow_from=99)
    points = history_points(nights, KEY, NAME, window=5)
    assert len(points) == len(nights)
    for i in range(HISTORY_RESULTS + 1, len(nights)):
        # over nights, night i is judged against up to 5 results before night i - 1
        before = nights[:i - 1][-5:]
        means = [sum(math.log(v) for v in c["metrics"][NAME]["values"]) / 4
                 for r in before for c in r["cells"] if c["key"] == KEY]
        n = len(means)
        centre = sum(means) / n
        sd = math.sqrt(sum((m - centre) ** 2 for m in means) / (n - 1))
        level = SUITE_ALPHA / 2  # the rate per comparison over its 2 judged metrics
        half = max(stats.t.ppf(1 - level, n - 1) * sd * math.sqrt(1 + 1 / n),
                   math.log1p(MIN_CHANGE))  # no move under MIN_CHANGE is flagged
        low, high = points[i]["band"]
        assert (low, high) == pytest.approx((math.exp(centre - half), math.exp(centre + half)))
        assert points[i]["y"] == pytest.approx(_geo(nights[i]["cells"][0]["metrics"][NAME]
                                                     ["values"]))
        assert low < points[i]["y"] < high  # same commit, same noise: inside
    assert not [p for p in points if p["verdict"]]  # A/A: nothing flagged
    assert points[-1]["url"] == "http://127.0.0.1:5000/#/runs/pipedream4"


def test_a_lasting_slowdown_is_suspicious_then_a_regression_and_only_in_its_cell() -> None:
    nights = _nights(slow_from=5, n=7)  # (later nights count the slow ones as history)
    points = history_points(nights, KEY, NAME, window=5)
    assert [p["verdict"] for p in points] == [""] * 5 + ["suspicious", "regression"]
    assert points[5]["y"] < points[5]["band"][0]
    ddp = history_points(nights, KEY.replace("pipedream", "ddp"), NAME, window=5)
    assert not [p for p in ddp if p["verdict"]]


def test_the_page_is_self_contained_and_draws_time_to_accuracy_only_for_target_cells() -> None:
    rng = random.Random(1)
    page = build_dashboard([_night(1, 1.0, rng), _night(2, 1.0, rng)])
    # nothing to fetch: no element loads a file (the browser test blocks the network too)
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=", page)
    assert "Plotly.newPlot" in page and "plotly.js" in page.lower()
    assert "No cell of this suite trains to a target." in page
    page = build_dashboard([_night(1, 1.0, rng, ttt=True), _night(2, 1.0, rng, ttt=True)])
    curves = re.findall(r'data-workload="vgg16" data-systems="([^"]*)" style', page)
    assert curves == ["gpipe"]  # the one wide figure of the curves: the target cell only
    # one history per throughput cell, each tagged with its system for the filter
    assert len(re.findall(r'<div class="fig" data-workload="vgg16" data-systems="(pipedream|'
                          r'ddp|gpipe)"><div class="plot"', page)) >= 3
