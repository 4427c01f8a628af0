"""Fault injection and progress reporting: how tests break a run, and how a run says where it is.

Fault injection (off by default) is the switch the failure tests use: ``--inject-fault
KIND:RANK:ACTION[@EPOCH]`` makes rank RANK, when it reaches ACTION (an action kind and a
minibatch: ``F3`` is the forward of minibatch 3, ``B0`` a backward, ``U2`` an update; see
``pipedream_impl.schedule`` for the kinds) in epoch EPOCH (default 0):

- ``raise``: raise an exception there (the worker reports its traceback);
- ``kill``: SIGKILL itself (no report: the launcher sees a dead process);
- ``stall``: stop making progress forever (only the watchdog can end the run).

A straggler, ``--inject-fault slow:RANK:ACTION:FACTOR`` (e.g. ``slow:1:F:1.2``), makes
every ACTION of rank RANK, in every minibatch and epoch, take FACTOR times as long (``*``
for RANK: every rank; for ACTION: every compute action, F B I W U, so ``slow:*:*:1.1``
is a machine 10% slower at computing, the benchmark's planted regression): the
rank spins on its core for (FACTOR - 1) x the action's own time right after it, before
the action is booked (so its busy time grows too, as a slower device's would). It is a
feature for straggler studies and the benchmark's planted regressions (``scripts/
nightly_power.py``).

Data-parallel executors act F, B, A (all-reduce wait) and U per minibatch; the peer engines
one ``step`` per minibatch, so only ``F`` (checked at the step's start) hits them.

Progress: every executor stamps ``Progress`` at the start and end of each action, into a
small memory-mapped file per rank (a "progress board" in /dev/shm, no system call per
action). The launcher reads the boards (``read_board``): its watchdog
(``pipedream_impl.runtime.launcher``) ends a run in which a rank made no progress for the
stall timeout, and every failure message names the rank, its stage and the action it was
in, even when the rank was killed before it could say anything.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserInputError
from pipedream_impl.schedule import BACKWARDS

__all__ = ["BOARD_BYTES", "COMPUTE_KINDS", "EVERY", "FAULT_KINDS", "Fault", "Progress",
           "board_path", "read_board"]

BOARD_BYTES = 512  # one JSON record per rank, newline-terminated, space-padded

FAULT_KINDS = ("raise", "kill", "stall", "slow")
_SPEC = re.compile(r"^(?P<kind>[a-z]+):(?P<rank>\d+):(?P<action>[A-Za-z]+)(?P<mb>\d+)"
                   r"(?:@(?P<epoch>\d+))?$")
_SLOW = re.compile(r"^slow:(?P<rank>\d+|\*):(?P<action>[A-Za-z]+|\*):(?P<factor>[0-9.]+)$")
EVERY = "*"  # slow: every rank, or every compute action
COMPUTE_KINDS = ("F", *BACKWARDS, "U")  # what ``*`` slows (not waits or transfers)


@dataclass(frozen=True)
class Fault:
    kind: str  # raise | kill | stall | slow
    rank: int
    action: str  # action kind: F, B, U, A, SF, RB, ...
    minibatch: int = -1  # -1: every minibatch (slow)
    epoch: int = 0
    factor: float = 1.0  # slow: how many times as long the action takes

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise UserInputError(f"--inject-fault: unknown kind {self.kind!r}; choose one of "
                                 f"{', '.join(FAULT_KINDS)}")
        if self.kind == "slow" and not (math.isfinite(self.factor) and self.factor >= 1):
            raise UserInputError(f"--inject-fault slow: FACTOR must be a number >= 1 (got "
                                 f"{self.factor})")

    @classmethod
    def parse(cls, text: str) -> Fault:
        slow = _SLOW.match(text.strip())
        if slow is not None:
            try:
                factor = float(slow["factor"])
            except ValueError:
                factor = math.nan
            rank = -1 if slow["rank"] == EVERY else int(slow["rank"])
            return cls("slow", rank, slow["action"], factor=factor)
        m = _SPEC.match(text.strip())
        if m is None:
            raise UserInputError(f"--inject-fault {text!r}: expected KIND:RANK:ACTION[@EPOCH], "
                                 f"e.g. kill:1:F3 (rank 1 at the forward of minibatch 3) or "
                                 f"stall:0:B2@1 (epoch 1), or slow:RANK:ACTION:FACTOR, e.g. "
                                 f"slow:1:F:1.2 (every forward of rank 1 takes 1.2x as long)")
        if m["kind"] == "slow":
            raise UserInputError(f"--inject-fault {text!r}: a straggler is "
                                 f"slow:RANK:ACTION:FACTOR, e.g. slow:1:F:1.2")
        return cls(m["kind"], int(m["rank"]), m["action"], int(m["mb"]),
                   int(m["epoch"] or 0))

    def __str__(self) -> str:
        if self.kind == "slow":
            rank = EVERY if self.rank < 0 else self.rank
            return f"slow:{rank}:{self.action}:{self.factor:g}"
        return f"{self.kind}:{self.rank}:{self.action}{self.minibatch}@{self.epoch}"

    def hits(self, rank: int, epoch: int, action: str, minibatch: int) -> bool:
        return self.kind != "slow" and (rank, epoch, action, minibatch) == (
            self.rank, self.epoch, self.action, self.minibatch)

    def slowdown(self, rank: int, action: str) -> float:
        """How many times as long ``action`` of ``rank`` takes (1: not slowed)."""
        if self.kind != "slow" or self.rank not in (-1, rank):
            return 1.0
        hit = action in COMPUTE_KINDS if self.action == EVERY else action == self.action
        return self.factor if hit else 1.0

    def fire(self) -> None:
        where = f"{self.action}{self.minibatch} of epoch {self.epoch}"
        if self.kind == "raise":
            raise RuntimeError(f"injected failure at {where}")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # stall: no progress, ever (the process stays alive and responsive)
            time.sleep(3600)


def board_path(directory: str, rank: int) -> Path:
    return Path(directory) / f"rank{rank}"


def read_board(path: Path) -> dict | None:
    """A rank's latest progress record, with ``age_s`` (seconds since it changed, by this
    machine's clock); None when there is none yet or the read caught a write halfway."""
    try:
        raw = path.read_bytes()[:BOARD_BYTES]
        state = json.loads(raw.split(b"\n", 1)[0])
    except (OSError, ValueError):
        return None
    state["age_s"] = time.time() - state["since"]
    return state


class Progress:
    """Where a worker is: the action it is in (or last finished) and since when.

    Written by the executor's thread; ``snapshot`` reads it in-process, the launcher reads
    the board file (``board``: a path, or None for no file). Each change replaces the
    record whole (about 4 us with the board write, twice per action).
    """

    def __init__(self, rank: int, board: Path | None = None) -> None:
        self.rank = rank
        self._state = {"rank": rank, "stage": None, "epoch": None, "action": "setting up",
                       "waiting": False, "active": False, "since": time.time()}
        self._map: mmap.mmap | None = None
        if board is not None:
            with open(board, "w+b") as f:
                f.truncate(BOARD_BYTES)
                self._map = mmap.mmap(f.fileno(), BOARD_BYTES)
            self._publish()

    def begin_epoch(self, epoch: int, stage: int) -> None:
        self._set(stage=stage, epoch=epoch, action="epoch start", waiting=False, active=True)

    def enter(self, action: str, waiting: bool) -> None:
        """Starting ``action`` (e.g. "F3"); ``waiting``: it waits on other ranks."""
        self._set(action=action, waiting=waiting)

    def leave(self, action: str) -> None:
        self._set(action=f"after {action}", waiting=False)

    def end_epoch(self) -> None:
        self._set(action="between epochs", waiting=False, active=False)

    def _set(self, **fields: object) -> None:
        self._state = {**self._state, **fields, "since": time.time()}
        if self._map is not None:
            self._publish()

    def _publish(self) -> None:
        data = json.dumps(self._state).encode()[:BOARD_BYTES - 1] + b"\n"
        self._map[:len(data)] = data

    def snapshot(self) -> dict:
        """A copy, with ``age_s``: seconds since the last change."""
        s = dict(self._state)
        s["age_s"] = time.time() - s["since"]
        return s
