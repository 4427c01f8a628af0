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


def _cell(key: str, workers: int, speeds: list[float], **raw: list[float]) -> dict:
    return {"key": key, "workers": workers, "run_ids": [f"{key}{i}" for i in range(len(speeds))],
            "metrics": {"reference_iterations_per_s": summarise(speeds).to_json(),
                        **{k: summarise(v).to_json() for k, v in raw.items()}}}


def test_the_drift_cancelled_twins_are_over_the_rounds_reference(tmp_path) -> None:  # noqa: ANN001
    # three rounds; the reference's i-th value of each cell was timed in round i; cells on
    # 2 workers share one reference per round (the median of theirs), the 4-worker cell
    # its own; a twin stored by an older definition (each repeat over its own reference)
    # is derived again
    thr, cpu = [100.0, 50.0, 80.0], [0.002, 0.004, 0.003]
    a = _cell("a", 2, [50.0, 25.0, 40.0], throughput_samples_per_s=thr, cpu_s_per_sample=cpu)
    a["metrics"]["throughput_per_reference"] = {"median": 7.0, "values": [7.0]}
    b = _cell("b", 2, [54.0, 21.0, 44.0], throughput_samples_per_s=thr)
    c = _cell("c", 2, [40.0, 23.0, 30.0])
    wide = _cell("w", 4, [90.0, 60.0, 80.0], throughput_samples_per_s=thr)
    gap = _cell("g", 2, [1.0, 1.0, 1.0], cpu_s_per_sample=cpu)  # a repeat with no figure
    gap["run_ids"].append("g3")
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"schema": SCHEMA, "cells": [a, b, c, wide, gap],
                             "definitions": {"steady_samples_per_s": 2}}))
    result = load_result(p)
    got = {c["key"]: c["metrics"] for c in result["cells"]}
    rounds = [50.0, 23.0, 40.0]  # medians of (50, 54, 40), (25, 21, 23), (40, 44, 30)
    assert got["a"]["throughput_per_reference"]["values"] == pytest.approx(
        [t / r for t, r in zip(thr, rounds, strict=True)])
    assert got["a"]["cpu_reference_per_sample"]["values"] == pytest.approx(
        [t * r for t, r in zip(cpu, rounds, strict=True)])
    assert got["b"]["throughput_per_reference"] == got["a"]["throughput_per_reference"]
    assert got["w"]["throughput_per_reference"]["values"] == pytest.approx(
        [100 / 90, 50 / 60, 80 / 80])
    assert "steady_per_reference" not in got["a"]  # no raw figure to derive it from
    assert "cpu_reference_per_sample" not in got["g"]  # no longer round by round
    assert result["definitions"]["throughput_per_reference"] == 2
    assert result["definitions"]["steady_samples_per_s"] == 2
