"""``scripts/round_blocking.py``'s correction of repeats for their rounds, against closed
forms: a shared round effect removed exactly, every cell's level kept, a cell's own value
never in its own correction, and too few cells left alone."""

from __future__ import annotations

import math

import pytest

from harness import metrics
from tests.scripts import load_script

NAME = metrics.STEADY_THROUGHPUT


def _result(levels: list[float], rounds: list[float]) -> dict:
    """Cells whose steady throughput in round r is level * round effect r, exactly."""
    cells = [{"key": f"c{i}", "status": "ok",
              "metrics": {NAME: {"values": [a * e for e in rounds]}}}
             for i, a in enumerate(levels)]
    return {"suite": {"repeats": len(rounds)}, "cells": cells}


def test_a_shared_round_effect_is_removed_and_every_level_kept() -> None:
    script = load_script("round_blocking")
    rounds = [1.0, 0.9, 1.1, 0.95]
    levels = [100.0, 200.0, 300.0, 400.0, 500.0]
    out = script.block(_result(levels, rounds))
    geo = math.exp(sum(math.log(e) for e in rounds) / len(rounds))
    for cell, a in zip(out["cells"], levels, strict=True):
        # the corrected repeats: the level at the rounds' geometric mean, in every round
        assert cell["metrics"][NAME]["values"] == pytest.approx([a * geo] * len(rounds))


def test_a_cells_own_value_is_not_in_its_correction() -> None:
    script = load_script("round_blocking")
    res = _result([100.0, 200.0, 300.0, 400.0], [1.0, 1.0, 1.0])
    res["cells"][0]["metrics"][NAME]["values"] = [100.0, 150.0, 100.0]  # its own swing
    out = script.block(res)
    # the others moved together in no round: c0 keeps its swing, the others are untouched
    assert out["cells"][0]["metrics"][NAME]["values"] == pytest.approx([100.0, 150.0, 100.0])
    # each other cell's effect is the median of three, one of them c0's: still zero
    for cell in out["cells"][1:]:
        assert len(set(round(v, 9) for v in cell["metrics"][NAME]["values"])) == 1


def test_too_few_cells_are_left_as_measured() -> None:
    script = load_script("round_blocking")
    res = _result([100.0, 200.0, 300.0], [1.0, 0.8, 1.2])
    out = script.block(res)
    assert [c["metrics"][NAME]["values"] for c in out["cells"]] == \
        [c["metrics"][NAME]["values"] for c in res["cells"]]
