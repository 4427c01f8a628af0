"""Parameters tied across pipeline stages: the rule that keeps their copies equal.

AWD-LM uses one matrix as its input embedding (first layer) and as its output decoder (last
layer). Split into stages, each stage holding one of those layers gets its own copy of the
matrix (``LayerModel.stage``, initialised identically); left alone the copies drift apart.
Megatron-LM keeps the word embedding on its first and last pipeline stage and, after the
flush and before the optimizer step, all-reduces the embedding gradient over those two
stages, so both copies take the same step. We do exactly that for flush schedules and adapt
it to PipeDream's asynchronous 1F1B, where waiting for the other copy's gradient before
every update would stall the pipeline.

The rule. A tie joins two unreplicated stages a < b (a stage holding both layers keeps them
one parameter and needs nothing). In an epoch of n updates, let g_a(i) be the tied weight's
gradient stage a gathered for its update i (its backwards since the previous update) and
g_b(j) stage b's for its update j. At its update j, *each copy* applies

    G(j) = g_b(j) + sum over i with u(i) = j, in increasing i, of g_a(i)

(then clipping, below, and the stage's optimizer step), where u(i), the update at which
stage a's gradient i is applied on both copies, is read off the epoch's schedule:

- u(i) = i (Megatron's sum before the step) where waiting for g_a(i) cannot delay stage b's
  next forward or backward: that action already happens-after stage a computed g_a(i).
  True at every update of GPipe and of model parallelism (one minibatch in flight), where
  stage b idles until stage a has finished the minibatch anyway; there training equals
  single-process training on whole minibatches.
- otherwise (1F1B with several minibatches in flight) u(i) is stage b's first update that
  happens-after stage a computed g_a(i), so no stage waits on a tie message longer than
  its transfer. In a straight PipeDream pipeline (1F1B, stage s runs w_s = S - s warm-up
  forwards) that is u(i) = i + w_a - w_b + 1 = i + (b - a + 1) while stage a has a forward
  after its backward of i (i + w_a < n): for the first and last of S stages, i + S. The
  embedding's gradient reaches the decoder's copy S updates late (the staleness 1F1B
  already gives the first stage's own weights); the decoder's reaches the embedding's copy
  with no delay. (With --in-flight k every stage runs k warm-up forwards, stage b idles
  for stage a as in a flush, and the first case applies up to the drain.)
- the drain: stage a's gradients that no later action of stage b happens-after (in a
  straight pipeline the epoch's last w_a) are applied at the epoch's last update, u(i) =
  n - 1, which waits for stage a's last backward (stage b has nothing left to do by then).
  Nothing carries over to the next epoch. No delay exceeds stage a's minibatches in
  flight (S for the first stage under NOAM).

g_b(j) is applied at update j on both copies: stage b sends it right after its backward,
before its update; stage a, downstream of that backward, receives it before its update j.

So both copies apply the same gradients in the same order. With an optimizer whose state is
per element (SGD, momentum, Adam) and the same learning rate, version v of the tied weight
(v updates applied) is the same tensor on both stages, bit for bit, at every v, and the
copies are equal after every epoch. Pipelining changes only which version each stage reads:
weight stashing gives each stage its forward's version (the embedding and the decoder of
one minibatch may read different versions, as any two stages do); vertical sync gives every
stage stage 0's version, so one minibatch reads one tied weight, as a single model would.

Clipping, where the workload clips: with every u(i) = i (flush schedules) the two stages
clip jointly, by one norm over both stages' gradients that counts the tied gradient once,
sqrt(|untied_a|^2 + |untied_b|^2 + |G|^2) (each tie message carries its sender's untied
squared norm): for a two-stage split that is the single process's global norm. Otherwise
each stage clips its untied parameters by their own norm (as any stage clips there)
and both copies clip G(j) by its own norm.

Messages are schedule actions (``with_ties`` inserts them into an epoch's schedule):
``ST j`` sends a stage's tied gradient of its update j, ``RT j`` receives the other stage's
gradient j. Stage b sends before each update and stage a receives right before its own;
stage a sends before each update and stage b receives where the rule above places it.
They go as ``Comm``'s ``T`` kind (their own tag), are counted in the link's bytes like any
message, and on each link are sent and received in the same order as the other messages
sharing it, so an in-order transport (NCCL) matches them too.

Refused, with a clear error: a tie on a replicated stage, over more than two stages, or
ties joining different pairs of stages. Other engines (torch pipelining, DeepSpeed) step
their own optimizers and keep no copies in sync: the harness refuses a tied split there.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from torch import Tensor, nn

from core.errors import ScheduleError, WorkloadError
from pipedream_impl.runtime.clipping import clip_by, sq_norm
from pipedream_impl.schedule import Action, Layout, Schedule, interleave, simulate

__all__ = ["Tie", "TiePlan", "TieSync", "check_link_order", "check_ties", "find_ties",
           "with_ties"]


@dataclass(frozen=True)
class Tie:
    """One weight held by two stages: ``stages`` (a, b) with a < b, and its parameter name
    in each stage's module (``LayerModel.stage`` names: ``layers.<i - start>.<name>``)."""
    stages: tuple[int, int]
    names: tuple[str, str]


def find_ties(model: nn.Module, bounds: tuple[tuple[int, int], ...]) -> tuple[Tie, ...]:
    """The weights of ``model`` (a ``LayerModel``) that ``bounds`` put on several stages.
    Raises WorkloadError for a weight on more than two stages."""
    holders: dict[int, dict[int, str]] = {}
    for s, (lo, hi) in enumerate(bounds):
        for li in range(lo, hi):
            for name, p in model.layers[li].named_parameters(remove_duplicate=False):
                holders.setdefault(id(p), {}).setdefault(s, f"layers.{li - lo}.{name}")
    ties = []
    for on in holders.values():
        if len(on) > 2:
            raise WorkloadError(f"this split puts one tied parameter on stages {sorted(on)}; "
                                "ties join at most two stages: keep its layers on fewer")
        if len(on) == 2:
            (a, na), (b, nb) = sorted(on.items())
            ties.append(Tie((a, b), (na, nb)))
    return tuple(ties)


def check_ties(model: nn.Module, bounds: tuple[tuple[int, int], ...],
               replicas: tuple[int, ...]) -> tuple[Tie, ...]:
    """``find_ties``, refusing what the rule does not cover (module docstring)."""
    ties = find_ties(model, bounds)
    if len({t.stages for t in ties}) > 1:
        raise WorkloadError("this split ties parameters between different pairs of stages; "
                            "keep every tied layer on the same two stages")
    for t in ties[:1]:
        if any(replicas[s] > 1 for s in t.stages):
            raise WorkloadError(f"stages {t.stages[0]} and {t.stages[1]} share a tied "
                                f"parameter ({t.names[0]}) and one is replicated "
                                f"(replicas {'-'.join(map(str, replicas))}); tied stages "
                                "must be unreplicated: change the config or keep the tied "
                                "layers on one stage")
    return ties


@dataclass(frozen=True)
class TiePlan:
    """For one epoch: ``applied_at[i]`` = u(i), the update at which stage a's gradient i is
    applied on both copies; ``joint``: every u(i) = i (flush schedules: joint clipping)."""
    applied_at: tuple[int, ...]

    def __post_init__(self) -> None:
        by_update: dict[int, list[int]] = {}
        for i, u in enumerate(self.applied_at):
            by_update.setdefault(u, []).append(i)
        object.__setattr__(self, "_by_update", by_update)  # read at every update

    @property
    def joint(self) -> bool:
        return all(u == i for i, u in enumerate(self.applied_at))

    def from_a(self, j: int) -> list[int]:
        """Stage a's gradients applied at update j, in increasing order."""
        return list(self._by_update.get(j, ()))


def _updates(acts: tuple[Action, ...]) -> list[int]:
    return [p for p, x in enumerate(acts) if x.kind == "U"]


def _seen(sched: Schedule, src: int, dst: int) -> list[int]:
    """For each action of rank ``dst``: how many of rank ``src``'s actions happened before
    it or are it (vector clocks over sends/receives and all-reduce barriers)."""
    layout, n = sched.layout, sched.layout.workers
    vc = [[0] * n for _ in range(n)]
    channels: dict[tuple[int, int, str], list[list[int]]] = {}
    barriers: dict[tuple[int, int], dict[int, list[int]]] = {}
    seen: list[int] = []

    def step(rank: int, pos: int, a: Action) -> bool:
        if a.kind[0] == "R":
            q = channels.get((a.peer, rank, a.kind[1]))
            if not q:
                return False
            vc[rank] = [max(x, y) for x, y in zip(vc[rank], q.pop(0), strict=True)]
        elif a.kind == "A":
            s, _ = layout.stage_of(rank)
            arrived = barriers.setdefault((s, a.mb), {})
            arrived[rank] = list(vc[rank])
            if len(arrived) < layout.replicas[s]:
                return False
            vc[rank] = [max(col) for col in zip(*arrived.values(), strict=True)]
        vc[rank][rank] += 1
        if a.kind[0] == "S":
            channels.setdefault((rank, a.peer, a.kind[1]), []).append(list(vc[rank]))
        if rank == dst:
            seen.append(vc[rank][src])
        return True

    interleave(sched.actions, step)
    return seen


def with_ties(sched: Schedule, stages: tuple[int, int]) -> tuple[Schedule, TiePlan]:
    """``sched`` with the tie messages between ``stages`` (a, b) inserted, and the plan
    u(i) (module docstring). Both stages must be unreplicated."""
    layout: Layout = sched.layout
    ra, rb = layout.rank(stages[0], 0), layout.rank(stages[1], 0)
    acts = [list(x) for x in sched.actions]
    ua, ub = _updates(sched.actions[ra]), _updates(sched.actions[rb])
    if len(ua) != len(ub):
        raise ScheduleError(f"tied stages {stages} update {len(ua)} and {len(ub)} times per "
                            "epoch; ties need the same number of updates")
    n = len(ub)
    # both stages send their gradient right before each update; stage a receives b's there
    for j in range(n - 1, -1, -1):
        acts[ra][ua[j]:ua[j]] = [Action("ST", j, peer=rb), Action("RT", j, peer=rb)]
        acts[rb][ub[j]:ub[j]] = [Action("ST", j, peer=ra)]
    base = Schedule(layout, sched.minibatches, sched.weights,
                    tuple(tuple(x) for x in acts), sched.microbatches)
    seen = _seen(base, ra, rb)
    sent_a = [p + 1 for p, x in enumerate(base.actions[ra]) if x.kind == "ST"]
    ub = _updates(base.actions[rb])
    compute = [p for p, x in enumerate(base.actions[rb]) if x.kind in ("F", "B")]
    applied_at, before = [], {}  # before[position in b's list] = receives placed there
    for i in range(n):
        # b's first action that happened after a sent i (``seen`` never decreases)
        q = bisect_left(seen, sent_a[i])
        first = q if q < len(seen) else None
        c = bisect_right(compute, ub[i])
        nxt = compute[c] if c < len(compute) else None  # b's next compute after update i
        if nxt is None or (first is not None and first <= nxt):
            u, where = i, ub[i]  # waiting cannot delay b's compute: Megatron's sum
        else:
            j = bisect_right(ub, first) if first is not None else n
            u, where = (j, first) if j < n else (n - 1, ub[n - 1])  # else the drain
        if u < i:
            raise ScheduleError(f"tie plan: stage a's gradient {i} would be applied at "
                                f"update {u}, before it exists")
        applied_at.append(u)
        before.setdefault(where, []).append(Action("RT", i, peer=ra))
    out = []
    for q, x in enumerate(base.actions[rb]):
        out += before.get(q, []) + [x]
    acts = list(base.actions)
    acts[rb] = tuple(out)
    tied = Schedule(layout, sched.minibatches, sched.weights, tuple(acts), sched.microbatches)
    simulate(tied)  # no deadlock, every message received in order
    check_link_order(tied)
    return tied, TiePlan(tuple(applied_at))


def check_link_order(sched: Schedule) -> None:
    """Every directed link's receives are posted in the order its sends were made, across
    message kinds. Tie messages share a link with activations or gradients when the tied
    stages are adjacent; NCCL's point-to-point ignores tags, so a receive posted out of
    the sender's order would pair with the wrong message there (gloo matches tags, so a
    CPU run could not notice)."""
    sends: dict[tuple[int, int], list[tuple[str, int]]] = {}
    receives: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for rank, acts in enumerate(sched.actions):
        for a in acts:
            if a.kind[0] == "S" and len(a.kind) == 2:
                sends.setdefault((rank, a.peer), []).append((a.kind[1], a.mb))
            elif a.kind[0] == "R" and len(a.kind) == 2:
                receives.setdefault((a.peer, rank), []).append((a.kind[1], a.mb))
    for link in sorted(set(sends) | set(receives)):
        if sends.get(link, []) != receives.get(link, []):
            raise ScheduleError(f"link {link[0]} -> {link[1]}: receives are not posted in "
                                "the order of the sends (NCCL pairs them by order)")


@dataclass
class TieSync:
    """One tied stage's side of the rule: what its ``ST``/``RT`` actions send and receive,
    and the tied gradient its update applies (``before_update``)."""
    side: int  # 0: stage a (the earlier), 1: stage b
    peer: int  # the other tied stage's rank
    stages: tuple[int, int]  # (a, b)
    tied: list[int]  # positions of the tied parameters in the stage's parameter list
    clip: float | None
    plan: TiePlan = field(default_factory=lambda: TiePlan(()))
    own: dict[int, list[Tensor]] = field(default_factory=dict)  # stage a: held g_a(i)
    got: dict[int, tuple[Tensor, ...]] = field(default_factory=dict)  # received messages
    untied_sq: dict[int, Tensor] = field(default_factory=dict)  # own untied squared norms

    @classmethod
    def for_stage(cls, ties: tuple[Tie, ...], stage: int, layout: Layout,
                  module: nn.Module, clip: float | None) -> TieSync | None:
        """The sync of ``stage``, or None where it holds no tied copy."""
        mine = [t for t in ties if stage in t.stages]
        if not mine:
            return None
        side = mine[0].stages.index(stage)
        names = [n for n, _ in module.named_parameters()]
        return cls(side, layout.rank(mine[0].stages[1 - side], 0), mine[0].stages,
                   [names.index(t.names[side]) for t in mine], clip)

    def schedule(self, sched: Schedule) -> Schedule:
        """An epoch's schedule with the tie messages; sets the epoch's plan."""
        tied, self.plan = with_ties(sched, self.stages)
        return tied

    def _untied(self, grads: list[Tensor]) -> list[Tensor]:
        return [g for k, g in enumerate(grads) if k not in self.tied]

    def send(self, act: Action, grads: list[Tensor], comm) -> None:  # noqa: ANN001
        """``ST j``: this stage's tied gradients of update j (and, for joint clipping, its
        untied squared norm), through ``comm`` (the executor's ``Comm`` or ``LocalComm``)."""
        mine = [grads[k].detach().clone() for k in self.tied]
        msg = list(mine)
        if self.clip is not None and self.plan.joint:
            self.untied_sq[act.mb] = sq_norm(self._untied(grads)).to(mine[0].device)
            msg.append(self.untied_sq[act.mb].reshape(1))
        if self.side == 0:
            self.own[act.mb] = mine
        comm.send(tuple(msg), self.peer, "T")

    def recv(self, act: Action, comm) -> None:  # noqa: ANN001
        """``RT j``: the other stage's message j."""
        self.got[act.mb] = comm.recv(self.peer, "T")

    def before_update(self, j: int, grads: list[Tensor]) -> None:
        """Replace the tied gradients of update j by G(j), then clip (module docstring)."""
        k = len(self.tied)
        b_part = self.got.pop(j) if self.side == 0 else None
        g = [t.clone() for t in b_part[:k]] if b_part is not None \
            else [grads[i].detach().clone() for i in self.tied]
        a_parts = {i: self.own.pop(i) if self.side == 0 else self.got.pop(i)
                   for i in self.plan.from_a(j)}
        for i in sorted(a_parts):
            for acc, t in zip(g, a_parts[i][:k], strict=True):
                acc += t
        for i, t in zip(self.tied, g, strict=True):
            grads[i] = t
        if self.clip is None:
            return
        untied = self._untied(grads)
        if self.plan.joint:  # one norm over both stages, the tied gradient counted once
            mine = self.untied_sq.pop(j)
            other = (b_part if self.side == 0 else a_parts[j])[k].reshape(())
            sq_a, sq_b = (mine, other) if self.side == 0 else (other, mine)
            clip_by(untied + g, (sq_a + sq_b + sq_norm(g)).sqrt(), self.clip)
        else:
            clip_by(untied, sq_norm(untied).sqrt(), self.clip)
            clip_by(g, sq_norm(g).sqrt(), self.clip)
