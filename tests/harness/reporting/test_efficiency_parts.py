"""scripts/efficiency.py's breakdown of the busier worker's minibatch, on hand-made rows.

Why: results/efficiency-*-tiny.md is read as where a pipeline's time goes (issue 24): each
part must be the difference it names, and the parts must add up to the worker's time per
minibatch. The rows here are made up so that every expected part is a subtraction done by
hand; nothing is run.
"""

from __future__ import annotations

import pytest

from tests.scripts import load_script

eff = load_script("efficiency")


def _row(f: float, b: float, u: float, sf: float = 0.0, sb: float = 0.0, idle: float = 0.0,
         busy: float | None = None, cpu: float | None = None) -> dict[str, float]:
    """``cpu``: the compute actions' CPU time (default: all of their wall time)."""
    row = {"F": f, "B": b, "U": u, "SF": sf, "SB": sb, "RF": 0.0, "RB": idle,
           "cpu": f + b + u if cpu is None else cpu}
    if busy is not None:
        row.update(busy=busy, idle=idle)
    return row


ALONE = {"whole": _row(6.0, 8.0, 2.0),  # 16 ms: the whole model, one process
         0: _row(3.0, 4.0, 1.0),        # 8 ms
         1: _row(3.5, 4.5, 1.0)}        # 9 ms: the two stages sum to 17
PIPED = {0: _row(3.2, 4.2, 1.1, sf=0.3, idle=2.0, busy=8.8),
         1: _row(3.8, 4.9, 1.1, sb=0.4, idle=0.5, busy=10.2, cpu=9.5)}  # the busier one


def test_each_part_is_the_difference_it_names_and_they_add_up() -> None:
    parts = eff._parts(15.0, ALONE, PIPED)
    values = [ms for _, ms in parts]
    # the single trainer: 15 ms -> 7.5 each; the runtime's whole model: 16 / 2 = 8;
    # the two stages' mean: 17 / 2 = 8.5; stage 1 alone: 9; stage 1 piped: 9.8, of which
    # 9.5 on its core (0.5 more CPU time than alone) and 0.3 off it (0 alone)
    assert values[:-1] == pytest.approx([7.5, 0.5, 0.5, 0.5, 0.5, 0.3, 0.4, 0.5])
    assert sum(values[:-1]) == pytest.approx(values[-1])
    assert values[-1] == pytest.approx(10.2 + 0.5)
    assert "worker 1" in parts[0][0] and "worker 1" in parts[-1][0]


def test_a_busy_action_of_another_kind_gets_a_line_of_its_own() -> None:
    piped = {0: PIPED[0], 1: {**PIPED[1], "busy": 10.5}}  # 0.3 ms booked as busy elsewhere
    parts = eff._parts(15.0, ALONE, piped)
    assert parts[-2] == ("+ other busy actions", pytest.approx(0.3))
    assert sum(ms for _, ms in parts[:-1]) == pytest.approx(parts[-1][1])


def test_means_over_repeats_keep_the_parts_additive() -> None:
    reps = [{1: _row(3.0, 4.0, 1.0, sb=0.2, busy=8.2, idle=1.0)},
            {1: _row(4.0, 5.0, 1.0, sb=0.6, busy=10.6, idle=0.0)},
            {1: _row(5.0, 4.0, 1.0, sb=0.2, busy=10.2, idle=0.3)}]
    # the median of each column would not add up here: 4 + 4 + 1 + 0.2 = 9.2, busy's 10.2
    row = eff._mean_rows(reps)[1]
    assert row["busy"] == pytest.approx(row["F"] + row["B"] + row["U"] + row["SB"])
    assert row["busy"] == pytest.approx((8.2 + 10.6 + 10.2) / 3)
    assert row["idle"] == pytest.approx(1.3 / 3)


def test_the_thread_table_shows_time_off_the_core_as_wall_above_cpu() -> None:
    rows = {r: {**row, "sys": 0.25, "faults": 3.0, "preempt": 0.5} for r, row in
            {**ALONE, "whole": ALONE["whole"]}.items()}
    piped = {r: {**row, "sys": 0.5, "faults": 9.0, "preempt": 2.0} for r, row in PIPED.items()}
    lines = eff._use_table(piped, rows)
    body = [line.split(" | ") for line in lines if line.startswith("| 1 | pipeline")]
    # stage 1 piped: wall 3.8 + 4.9 + 1.1 = 9.8, CPU 9.5, so 0.3 off its core
    assert body == [["| 1", "pipeline", "9.80", "9.50", "0.50", "0.30", "9.0", "2.00 |"]]
    assert any(line.startswith("| whole | one process | 16.00 | 16.00 |") for line in lines)
