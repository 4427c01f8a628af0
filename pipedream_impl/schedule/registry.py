"""The registry of schedules: each schedule declared once, with its builder and its rules.

A ``ScheduleKind`` says what a schedule allows: microbatches (and their default count),
a flush before each update, replicated stages, ``--recompute`` (re-running the forward in
the backward on the live weights, correct only where no update falls between a unit's
forward and its backward), stages per worker, a split backward (I and W), how many weight
versions a stage keeps, and which torch.distributed.pipelining class runs it as a peer.
The stage executor builds its action lists through ``build``, the simulator likewise, the
registry of training systems (``harness.systems``) reads a system's rules here, the run
checks (``harness.config``) ask ``require_recompute``, and the torch peers read their
schedule class. Adding a schedule is one entry here plus its builder.

Schedules with several stages per worker (torch's interleaved and V-shaped ones) have no
builder of ours: torch's runtime runs them and the simulator reads their action lists from
torch (``harness.sim.multistage``). ``custom`` is built from a schedule file's compute
order (``torch_csv``). ``scripts/schedules_doc.py`` renders the registry into
``docs/schedules.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.errors import UserInputError, lookup
from pipedream_impl.schedule.actions import Layout, Schedule
from pipedream_impl.schedule.builders import gpipe, one_f_one_b
from pipedream_impl.schedule.compute_order import Op, from_compute_order
from pipedream_impl.schedule.successors import one_f_one_b_flush, two_bw
from pipedream_impl.schedule.zero_bubble import zb_h1

__all__ = ["DEFAULT", "MICROBATCHES_PER_STAGE", "SCHEDULES", "ScheduleKind", "build", "get",
           "microbatches", "names", "ours", "require_recompute"]

MICROBATCHES_PER_STAGE = 4  # the default microbatches per minibatch: this many per stage
DEFAULT = "1f1b"  # PipeDream's: what a stage executor runs unless told otherwise

# (layout, minibatches, microbatches, weight mode, in-flight minibatches) -> Schedule
Builder = Callable[[Layout, int, int, str, "int | None"], Schedule]


@dataclass(frozen=True)
class ScheduleKind:
    name: str
    summary: str  # one line for help texts and docs
    builder: Builder | None = None  # None: only a peer engine runs it (no builder of ours)
    microbatched: bool = False  # a minibatch is split into microbatches
    flushes: bool = False  # drains the pipeline before each (synchronous) update
    replicated: bool = False  # stages may have replicas (1F1B-RR)
    recompute: bool = False  # --recompute is correct: no update between a unit's F and B
    stages_per_worker: int = 1  # model stages each worker holds
    split_backward: bool = False  # the backward runs as I (input) and W (weight) halves
    weight_versions: str = "1"  # weight versions a stage keeps (for docs and tables)
    torch_class: str | None = None  # the torch.distributed.pipelining class that runs it
    v_shaped: bool = False  # several stages per worker placed in a V (else looped)
    # what torch's class asks of the microbatch count: "at-least-stages", "whole-rounds"
    # (a multiple of max(1, microbatches // workers)) or nothing
    torch_microbatches: str = ""
    from_file: bool = False  # built from a schedule file's compute order (``torch_csv``)


def _one_f_one_b(layout: Layout, minibatches: int, microbatches: int, weights: str,
                 in_flight: int | None) -> Schedule:
    return one_f_one_b(layout, minibatches, weights, in_flight)


SCHEDULES: tuple[ScheduleKind, ...] = (
    ScheduleKind(DEFAULT, "PipeDream's 1F1B (1F1B-RR on replicated stages), no flush",
                 _one_f_one_b, replicated=True,
                 weight_versions="one per minibatch in flight (stashed)"),
    ScheduleKind("flush", "GPipe: every microbatch's forward, then every backward, a flush",
                 lambda lay, n, m, w, f: gpipe(lay, n, m), microbatched=True, flushes=True,
                 recompute=True, torch_class="ScheduleGPipe"),
    ScheduleKind("1f1b-flush", "1F1B within each minibatch, then a flush (PipeDream-Flush)",
                 lambda lay, n, m, w, f: one_f_one_b_flush(lay, n, m), microbatched=True,
                 flushes=True, recompute=True, torch_class="Schedule1F1B",
                 torch_microbatches="at-least-stages"),
    ScheduleKind("2bw", "1F1B without a flush, updates one step late (PipeDream-2BW)",
                 lambda lay, n, m, w, f: two_bw(lay, n, m), microbatched=True,
                 weight_versions="2 (double-buffered)"),
    ScheduleKind("zb-h1", "zero bubble ZB-H1: 1F1B with B split into I and W, W deferred "
                 "to fill the drain, a flush", lambda lay, n, m, w, f: zb_h1(lay, n, m),
                 microbatched=True, flushes=True, recompute=True, split_backward=True),
    ScheduleKind("custom", "a schedule file: torch.distributed.pipelining's compute-only CSV, "
                 "one step per minibatch, then a flush", microbatched=True, flushes=True,
                 recompute=True, from_file=True,
                 torch_class="schedules._PipelineScheduleRuntime"),
    ScheduleKind("interleaved-1f1b", "interleaved 1F1B over looped stages, a flush",
                 microbatched=True, flushes=True, stages_per_worker=2,
                 torch_class="ScheduleInterleaved1F1B", torch_microbatches="whole-rounds"),
    ScheduleKind("zb", "zero bubble ZB1P over looped stages, a flush", microbatched=True,
                 flushes=True, stages_per_worker=2, split_backward=True,
                 torch_class="ScheduleInterleavedZeroBubble", torch_microbatches="whole-rounds"),
    ScheduleKind("zbv", "zero bubble ZB-V over V-shaped stages, a flush", microbatched=True,
                 flushes=True, stages_per_worker=2, split_backward=True,
                 torch_class="ScheduleZBVZeroBubble", v_shaped=True),
    ScheduleKind("dualpipev", "DualPipeV over V-shaped stages, a flush", microbatched=True,
                 flushes=True, stages_per_worker=2, split_backward=True,
                 torch_class="ScheduleDualPipeV", v_shaped=True,
                 torch_microbatches="at-least-stages"),
)
_BY_NAME = {s.name: s for s in SCHEDULES}


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def ours() -> tuple[ScheduleKind, ...]:
    """The schedules our runtime builds and runs (a builder, or a schedule file's order)."""
    return tuple(s for s in SCHEDULES if s.builder is not None or s.from_file)


def get(name: str) -> ScheduleKind:
    """The schedule called ``name``; a clear error listing the choices otherwise."""
    return lookup(_BY_NAME, name, "schedule")


def microbatches(name: str, stages: int, given: int | None = None) -> int:
    """Microbatches per minibatch: ``given``, else the default for ``stages`` stages (1 for
    a schedule that does not split minibatches)."""
    if not get(name).microbatched:
        return 1
    return given or MICROBATCHES_PER_STAGE * stages


def build(name: str, layout: Layout, minibatches: int, microbatches: int = 1,
          weights: str = "stash", in_flight: int | None = None,
          order: Sequence[Sequence[Op]] | None = None) -> Schedule:
    """Schedule ``name``'s action lists (validated) for ``layout``; a schedule file's
    compute ``order`` for the schedules read from files."""
    kind = get(name)
    if kind.from_file:
        if order is None:
            raise UserInputError(f"the {name} schedule is read from a file: give "
                                 "--schedule-file FILE")
        sched = from_compute_order([list(row) for row in order], minibatches, microbatches)
        if sched.stage_ranks is not None or sched.layout.replicas != layout.replicas:
            raise UserInputError(f"the schedule file puts {sched.stages} stages on "
                                 f"{sched.layout.workers} ranks; this run has "
                                 f"{layout.workers} workers of one stage each (stage s on "
                                 "rank s); schedule files with several stages per rank are "
                                 "not supported here")
        return sched
    if kind.builder is None:
        raise UserInputError(f"schedule {name!r} has no builder here: torch's runtime runs "
                             "it (a torch peer)")
    return kind.builder(layout, minibatches, microbatches, weights, in_flight)


def require_recompute(name: str, in_flight: int | None = None, who: str = "") -> None:
    """Refuse ``--recompute`` where the recomputed forward would see other weights than the
    forward did: an update falls between them (1F1B with more than one minibatch in
    flight, 2BW). With one minibatch in flight 1F1B updates only after its backward."""
    kind = get(name)
    if kind.recompute or (kind.name == DEFAULT and in_flight == 1):
        return
    whose = f"{who}'s {name}" if who else f"the {name}"
    raise UserInputError(f"--recompute: {whose} schedule updates the weights between a "
                         "minibatch's forward and its backward, so a recomputed forward "
                         "would use other weights than the forward did (weight stashing "
                         "would be lost); drop --recompute")
