"""Schedules as files: torch.distributed.pipelining's CSV schedule format, read and written.

torch writes a schedule's ``pipeline_order`` with ``_dump_csv`` and reads one with
``_load_csv`` (what torchtitan's custom-schedule option runs): one row per rank, one cell
per compute action, ``<stage><kind><microbatch>`` with kind F (forward), B (whole
backward), I (input gradient) or W (weight gradient), e.g. ``0F1``; an empty cell is an
idle slot; ``(0F1;1B0)OVERLAP_F_B`` runs its parts in turn. This is the compute-only form:
the messages are derived (``compute_order.from_compute_order`` for our runtime and
simulator, torch's lowering pass for its runtime). A row lists one step (one minibatch of
M microbatches); every step ends in one optimizer step (a flush).

``read_csv`` (a file) and ``parse_csv`` (its text) make a compute order, naming the cell,
row and column of any mistake; ``write_csv`` writes one; ``order_of`` reads one step of
one of our flushing schedules back as a compute order, so it can be written and run on
torch's runtime.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from core.errors import ScheduleError, read_text
from pipedream_impl.schedule.actions import BACKWARDS, Schedule
from pipedream_impl.schedule.compute_order import Op

__all__ = ["microbatches_of", "order_of", "parse_csv", "read_csv", "write_csv"]

_CELL = re.compile(r"^(\d+)(F|I|B|W)(\d+)$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")
_COMMS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")


def _cell(text: str, where: str) -> list[Op]:
    text = text.strip()
    if not text:
        return []
    overlap = _OVERLAP.match(text)
    if overlap:
        return [op for part in overlap.group(1).split(";") for op in _cell(part, where)]
    m = _CELL.match(text)
    if m is None:
        why = ("a communication action: write the compute-only form (F, B, I, W), the "
               "messages are derived" if any(c in text for c in _COMMS) else
               "expected <stage><F|B|I|W><microbatch>, e.g. 0F1")
        raise ScheduleError(f"{where}: cannot read {text!r}: {why}")
    return [(m.group(2), int(m.group(1)), int(m.group(3)))]


def read_csv(path: str | Path) -> list[list[Op]]:
    """The compute order in a CSV schedule file."""
    return parse_csv(read_text(path, "schedule file", "write one row per rank of cells "
                                                      "like 0F1 (torch's compute-only CSV)"))


def parse_csv(text: str) -> list[list[Op]]:
    """The compute order in CSV text (one row per rank)."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        raise ScheduleError("the schedule file is empty; write one row per rank")
    return [[op for col, cell in enumerate(row, 1)
             for op in _cell(cell, f"rank {rank} (row {rank + 1}, column {col})")]
            for rank, row in enumerate(rows)]


def write_csv(order: list[list[Op]]) -> str:
    """The compute order in torch's CSV form (one row per rank)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in order:
        writer.writerow([f"{s}{kind}{j}" for kind, s, j in row])
    return out.getvalue()


def microbatches_of(order: list[list[Op]]) -> int:
    """Microbatches per step: one more than the largest microbatch the order names."""
    return 1 + max((j for row in order for _, _, j in row), default=-1)


def order_of(sched: Schedule, step: int = 0) -> list[list[Op]]:
    """Minibatch ``step`` of a schedule that flushes every minibatch, as a compute order."""
    m = sched.microbatches
    out = []
    for rank, acts in enumerate(sched.actions):
        row: list[Op] = []
        for a in acts:
            if a.kind in ("F", *BACKWARDS):
                if a.version != -1 and a.mb // m != a.version:
                    raise ScheduleError(f"rank {rank}: {a} is not a flush schedule's action "
                                        "(minibatch k on version k): a CSV step cannot hold it")
                if a.mb // m == step:
                    row.append((a.kind, sched.stage_at(rank, a), a.mb - step * m))
        out.append(row)
    return out
