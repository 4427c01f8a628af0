"""harness/reporting/results.py: the repeats rule against a brute-force reading of it."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics

import pytest

from core.errors import UserInputError
from harness.reporting.results import SCHEMA, load_result, overhead_rows, summarise


def test_few_repeats_keep_every_value() -> None:
    s = summarise([3.0, 1.0, 2.0])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.rel_spread == pytest.approx(1.0)
    assert not s.stable


def test_five_or_more_repeats_drop_the_extremes() -> None:
    rng = random.Random(0)
    for n in range(5, 10):
        values = [rng.uniform(90, 110) for _ in range(n)]
        values[rng.randrange(n)] = 1e6  # an outlier never sets the spread
        s = summarise(values)
        kept = sorted(values)[1:-1]
        assert s.high == max(kept) < 1e6 and s.low == min(kept)
        assert s.median == statistics.median(kept)
        assert s.stable == ((max(kept) - min(kept)) / statistics.median(kept) <= 0.10)


def test_missing_values_are_left_out_not_counted() -> None:
    assert summarise([None, math.nan]) is None
    assert summarise([None, 4.0, math.nan]).n == 1


def test_overhead_pairs_a_tracked_cell_with_its_untracked_twin() -> None:
    def cell(key: str, thr: float) -> dict:
        return {"key": key, "metrics": {"throughput_samples_per_s": {"median": thr}}}

    rows = overhead_rows([cell("a/throughput", 98.0), cell("a/throughput/untracked", 100.0),
                          cell("b/throughput", 50.0)])
    assert len(rows) == 1 and rows[0]["cell"] == "a/throughput"
    assert rows[0]["overhead"] == pytest.approx(0.02)


def test_result_files_are_checked_for_their_schema(tmp_path) -> None:  # noqa: ANN001
    for i, body in enumerate(("not json", json.dumps({"schema": "other/1"}), "[1, 2]")):
        p = tmp_path / f"{i}.json"
        p.write_text(body)
        with pytest.raises(UserInputError):
            load_result(p)
    p = tmp_path / "ok.json"
    p.write_text(json.dumps({"schema": SCHEMA, "cells": []}))
    assert load_result(p)["cells"] == []
    with pytest.raises(UserInputError, match="no suite result"):
        load_result(tmp_path / "absent.json")


def test_permutations_do_not_change_the_numbers() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    first = summarise(values)
    for perm in itertools.permutations(values):
        s = summarise(perm)
        assert (s.median, s.low, s.high) == (first.median, first.low, first.high)


def test_an_older_result_gets_the_drift_cancelled_twins_it_lacks(tmp_path) -> None:  # noqa: ANN001
    # CPU per sample measured, its drift-cancelled twin not (a result from before it was):
    # derived per repeat as CPU seconds x reference iterations/s; a twin measured is kept
    cpu, speed = [0.002, 0.004, 0.003], [50.0, 25.0, 40.0]
    kept = {"median": 7.0, "values": [7.0]}
    cell = {"key": "k", "metrics": {
        "cpu_s_per_sample": summarise(cpu).to_json(),
        "reference_iterations_per_s": summarise(speed).to_json(),
        "throughput_samples_per_s": summarise([100.0, 50.0, 80.0]).to_json(),
        "throughput_per_reference": kept}}
    uneven = {"key": "u", "metrics": {"cpu_s_per_sample": summarise(cpu).to_json(),
                                      "reference_iterations_per_s": summarise([9.0]).to_json()}}
    # a repeat missing from each list: as long, but no longer repeat by repeat
    gaps = {"key": "g", "run_ids": ["a", "b", "c", "d"],
            "metrics": {"cpu_s_per_sample": summarise(cpu).to_json(),
                        "reference_iterations_per_s": summarise(speed).to_json()}}
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"schema": SCHEMA, "cells": [cell, uneven, gaps]}))
    got = {c["key"]: c["metrics"] for c in load_result(p)["cells"]}
    assert got["k"]["cpu_reference_per_sample"]["values"] == pytest.approx([0.1, 0.1, 0.12])
    assert got["k"]["cpu_reference_per_sample"]["median"] == pytest.approx(0.1)
    assert got["k"]["throughput_per_reference"] == kept
    assert "steady_per_reference" not in got["k"]  # no raw figure to derive it from
    assert "cpu_reference_per_sample" not in got["u"]  # repeats that do not pair up
    assert "cpu_reference_per_sample" not in got["g"]
