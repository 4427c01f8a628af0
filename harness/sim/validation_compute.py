"""The validation's diagnosis of a run's compute and communication: how much longer each
stage's compute took inside the run than the same actions measured alone, per stage and
per kind of action, and the action costs scaled by those ratios for the diagnostic
simulation; and the run's own time per send and per receive, for a second one.

Why apart from ``validation``: the ratios are arithmetic on a run's metrics and the
measured costs, tested on figures worked out by hand without running anything, while
``validation`` runs and simulates.
"""

from __future__ import annotations

from harness import metrics
from harness.sim.simulator import build_schedule
from pipedream_impl.runtime.faults import COMPUTE_KINDS  # F, B, I, W, U: what is computed

__all__ = ["comm_counts", "comm_in_run", "compute_in_run", "cpu_of_kinds", "kinds_in_run",
           "ratios_cell", "scale_compute"]


def scale_compute(actions: dict[int, dict[str, float]], ratios: dict[int, float],
                  per_kind: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """``actions`` with each compute action's cost times its kind's in-run ratio, else its
    stage's (transfers and all-reduces as they are)."""
    return {st: {kd: v * per_kind.get(st, {}).get(kd, ratios[st]) if kd in COMPUTE_KINDS
                 else v for kd, v in a.items()} for st, a in actions.items()}


def _units(kind: str, microbatches: int) -> int:
    """How many times a minibatch runs ``kind``: once per microbatch, the update once."""
    return 1 if kind == "U" else microbatches


def compute_in_run(actions: dict[int, dict[str, float]], final: dict[str, float],
                   microbatches: int) -> dict[int, float]:
    """Each stage's compute per minibatch in the run (``metrics.STAGE_MEASURED``, ms) over
    the same from the action costs measured alone (``microbatches`` units of F and the
    backward kinds, one U); empty unless the run measured every stage (our runtime's
    pipelines do; data parallelism does not)."""
    ratios = {}
    for st, a in actions.items():
        got = final.get(metrics.key(metrics.STAGE_MEASURED, stage=st))
        alone = 1e3 * sum(_units(kd, microbatches) * a.get(kd, 0.0) for kd in COMPUTE_KINDS)
        if got is None or not alone > 0:
            return {}
        ratios[st] = got / alone
    return ratios


def kinds_in_run(actions: dict[int, dict[str, float]], final: dict[str, float],
                 microbatches: int, replicas: tuple[int, ...]) -> dict[int, dict[str, float]]:
    """``compute_in_run`` split by action kind: the kind's share of the seconds the
    stage's worker timed in the run (``metrics.ACTION_TIME``, warm-up epoch included)
    times the stage's compute per minibatch in the run (``metrics.STAGE_MEASURED``), over
    ``_units`` of the kind's cost alone. Only where every stage is one worker (rank =
    stage, as on the validation's straight splits), the run measured every stage, and
    each worker timed exactly the compute kinds its stage has a cost for alone; else
    empty."""
    if any(r != 1 for r in replicas):
        return {}
    out = {}
    for st, a in actions.items():
        run_ms = final.get(metrics.key(metrics.STAGE_MEASURED, stage=st))
        kinds = [kd for kd in COMPUTE_KINDS if a.get(kd, 0.0) > 0]
        timed = {kd: final.get(metrics.key(metrics.ACTION_TIME, kind=kd, worker=st), 0.0)
                 for kd in COMPUTE_KINDS}
        if run_ms is None or not kinds or any(not timed[kd] > 0 for kd in kinds) or \
                any(timed[kd] > 0 for kd in COMPUTE_KINDS if kd not in kinds):
            return {}  # a stage unmeasured, or a kind one side has and the other not
        total = sum(timed.values())
        out[st] = {kd: run_ms * timed[kd] / total / (1e3 * _units(kd, microbatches) * a[kd])
                   for kd in kinds}
    return out


def cpu_of_kinds(per_kind: dict[int, dict[str, float]], final: dict[str, float]
                 ) -> dict[int, dict[str, float]]:
    """``kinds_in_run``'s ratios as CPU: each kind's ratio times the share of its timed
    seconds the worker's main thread spent on a core (``metrics.ACTION_CPU`` over
    ``metrics.ACTION_TIME`` of the kind; rank = stage): the compute's own CPU per unit in
    the run over its cost alone, without the time it waited for a core. Empty where
    ``per_kind`` is or the run did not log both."""
    out = {}
    for st, kinds in per_kind.items():
        out[st] = {}
        for kd, ratio in kinds.items():
            wall = final.get(metrics.key(metrics.ACTION_TIME, kind=kd, worker=st))
            cpu = final.get(metrics.key(metrics.ACTION_CPU, kind=kd, worker=st))
            if not wall or cpu is None:
                return {}
            out[st][kd] = ratio * cpu / wall
    return out


def ratios_cell(stage_ratios: tuple[float, ...],
                kind_ratios: tuple[dict[str, float], ...]) -> str:
    """``1.18 (F 1.20 B 1.25 U 0.95) / ...``: each stage's ratio and its kinds', or ``-``."""
    if not stage_ratios:
        return "-"
    kinds = kind_ratios or ({},) * len(stage_ratios)
    return " / ".join(f"{x:.2f}" + (" (" + " ".join(f"{kd} {v:.2f}" for kd, v in k.items())
                                    + ")" if k else "")
                      for x, k in zip(stage_ratios, kinds, strict=True))


def comm_in_run(final: dict[str, float], counts: dict[int, dict[str, int]], epochs: float,
                cpu: bool = False
                ) -> tuple[dict[tuple[int, str], float], dict[tuple[int, str], float]]:
    """The run's own seconds per send and per receive of each stage, keyed as the machine
    model's ``send_s`` and ``recv_s`` ((stage, "F" or "B")): a send's whole time in the run
    (``metrics.ACTION_TIME`` of SF, SB), a receive's CPU time on the worker's main thread
    (``metrics.ACTION_CPU`` of RF, RB: its wall time holds the wait for the message, which
    the simulation makes itself; so without the time the thread was off its core, a lower
    bound), each over how many the run did: ``counts`` of each kind per epoch on each rank
    (rank = stage, as on the validation's straight splits) times ``epochs``, the
    minibatches the run did over an epoch's (warm-up included). ``cpu``: a send's CPU
    time too, not its wall time. Empty where the run did not log them all."""
    send, recv = {}, {}
    for st, kinds in counts.items():
        for kind, n in kinds.items():
            name = metrics.ACTION_TIME if kind[0] == "S" and not cpu else metrics.ACTION_CPU
            secs = final.get(metrics.key(name, kind=kind, worker=st))
            if secs is None or not n or not epochs:
                return {}, {}
            (send if kind[0] == "S" else recv)[(st, kind[1])] = secs / (n * epochs)
    return send, recv


def comm_counts(system, replicas: tuple[int, ...], k: int, m: int) \
        -> dict[int, dict[str, int]]:  # noqa: ANN001 - a systems.System
    """How many sends and receives of each kind each rank does per epoch of ``k``
    minibatches of ``m`` microbatches, from the runtime's schedule."""
    sched = build_schedule(system, replicas, k, m)
    return {r: {kd: sum(a.kind == kd for a in row) for kd in ("SF", "SB", "RF", "RB")
                if any(a.kind == kd for a in row)}
            for r, row in enumerate(sched.actions)}
