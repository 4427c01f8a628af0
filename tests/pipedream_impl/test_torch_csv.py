"""pipedream_impl/schedule/torch_csv.py: torch.distributed.pipelining's CSV schedule format,
read and written; checked against torch's own action parser and printer."""

from __future__ import annotations

import pytest
from torch.distributed.pipelining.schedules import _Action, _ComputationType

from core.errors import ScheduleError
from pipedream_impl.schedule import Layout
from pipedream_impl.schedule import registry as schedules
from pipedream_impl.schedule.compute_order import from_compute_order
from pipedream_impl.schedule.torch_csv import microbatches_of, order_of, parse_csv, write_csv


@pytest.mark.parametrize("name", ["flush", "1f1b-flush", "zb-h1"])
def test_our_flush_schedules_round_trip_through_the_file(name: str) -> None:
    """A step written and read back rebuilds the very action lists; torch parses every cell
    we write to the same (stage, kind, microbatch)."""
    sched = schedules.build(name, Layout((1, 1, 1)), 3, 4)
    order = order_of(sched)
    text = write_csv(order)
    for row, line in zip(order, text.splitlines(), strict=True):
        parsed = [_Action.from_str(c) for c in line.split(",")]
        assert [(a.computation_type.value, a.stage_index, a.microbatch_index)
                for a in parsed] == row
    assert parse_csv(text) == order
    assert microbatches_of(order) == 4
    assert from_compute_order(parse_csv(text), 3, 4).actions == sched.actions


def test_torch_cells_we_read_as_torch_does() -> None:
    """Idle cells, overlapped pairs and torch's printing of each action kind."""
    cells = [repr(_Action(1, _ComputationType(k), 2)) for k in "FIWB"]  # torch prints
    order = parse_csv(",".join(cells) + ",,(0F3;1B0)OVERLAP_F_B\n")
    assert order == [[("F", 1, 2), ("I", 1, 2), ("W", 1, 2), ("B", 1, 2), ("F", 0, 3),
                      ("B", 1, 0)]]


def test_bad_files_are_explained() -> None:
    with pytest.raises(ScheduleError, match=r"rank 1 \(row 2, column 2\): cannot read '0X1'"):
        parse_csv("0F0,0B0\n1F0,0X1\n")
    with pytest.raises(ScheduleError, match="communication action: write the compute-only"):
        parse_csv("0F0,0SEND_F0,0B0\n")
    with pytest.raises(ScheduleError, match="empty"):
        parse_csv("")
    with pytest.raises(ScheduleError, match="stage 0 has actions on ranks 0 and 1"):
        from_compute_order(parse_csv("0F0,0B0\n0F0,1F0,1B0\n"), 1, 1)
    # the validator names what is wrong: a backward before its forward
    with pytest.raises(ScheduleError, match="backward of 0 before its forward"):
        from_compute_order(parse_csv("0B0,0F0\n1F0,1B0\n"), 1, 1)
    # a forward of stage 1 whose input stage 0 never sends: a deadlock
    with pytest.raises(ScheduleError, match="does not complete exactly"):
        from_compute_order(parse_csv("0F0,0B0\n1F0,1F1,1B0,1B1\n"), 1, 2)
