"""Every rank of an unreplicated pipeline in one process, with the runtime's own handlers.

``run_local`` builds one ``StageExecutor`` per rank, swaps its ``Comm`` for an in-memory
mailbox (``LocalComm``: a send hands the receiver a detached copy, as the wire does), and
interleaves the ranks' action lists the way the schedule engine does: a rank runs until a
receive finds nothing waiting. Every forward, backward and update is the real runtime's code
on the real data, so the epoch report's ``action_s`` is what each action costs on this
machine with no transfer, no waiting and no other process competing for the CPU: the
simulator's validation uses it as the measured cost of each action (its
"runtime-path profile"), and the messages each stage sent (``typical_messages``) as the
ones to time through the real transport; the tests use it as an in-process reference.

Replicated stages are not covered (an all-reduce needs every replica): give a straight
plan or a single stage.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import torch
from torch import Tensor

from core.errors import UserInputError
from pipedream_impl.runtime.clipping import sq_norm
from pipedream_impl.runtime.comm import LinkStats
from pipedream_impl.runtime.contract import EpochReport, WorkerPieces, WorkerSpec
from pipedream_impl.runtime.stage_executor import StageExecutor
from pipedream_impl.schedule import Action, interleave

__all__ = ["LocalComm", "action_costs", "local_executors", "play_epoch", "run_local",
           "typical_messages"]


class LocalComm:
    """``Comm``'s interface over a shared mailbox (no process group)."""

    def __init__(self, rank: int, mailbox: dict) -> None:
        self.rank, self.mailbox = rank, mailbox
        self.norms_posted = self.norms_used = 0  # this rank's shares of global clipping
        self.stats = LinkStats()
        # (dst, kind) -> the (dtype, shape) of every message's tensors, in order
        self.messages: dict[tuple[int, str], list[list[tuple]]] = defaultdict(list)

    def send(self, tensors: tuple[Tensor, ...], dst: int, kind: str) -> None:
        self.messages[(dst, kind)].append([(t.dtype, tuple(t.shape)) for t in tensors])
        self.mailbox[(self.rank, dst, kind)].append(tuple(t.detach().clone() for t in tensors))
        self.stats.payload[(self.rank, dst)] += sum(t.numel() * t.element_size()
                                                   for t in tensors)

    def ready(self, src: int, kind: str) -> bool:
        return bool(self.mailbox[(src, self.rank, kind)])

    def recv(self, src: int, kind: str, prefetch: int = 0) -> tuple[Tensor, ...]:
        return self.mailbox[(src, self.rank, kind)].pop(0)

    def allreduce_mean(self, tensors: list[Tensor], ranks: tuple[int, ...]) -> None:
        if len(ranks) > 1:
            raise UserInputError("in-process runs cover unreplicated pipelines only")

    def post_norm(self, share: Tensor) -> None:
        """This rank's share of the next ``norm_sum``, on the board every rank reads."""
        self.mailbox[("norm", self.norms_posted)].append(share)
        self.norms_posted += 1

    def norm_ready(self, world: int) -> bool:
        """Whether every rank has posted its share of this rank's next ``norm_sum``."""
        return len(self.mailbox[("norm", self.norms_used)]) == world

    def norm_sum(self, share: Callable[[], Tensor]) -> Tensor:
        """The sum of the shares posted (this rank's posted before: ``share`` is not
        called)."""
        total = torch.stack(self.mailbox[("norm", self.norms_used)]).double().sum()
        self.norms_used += 1
        return total.float()

    def settle(self, dst: int, kind: str, count: int) -> None:
        pass  # a mailbox holds no send handles

    def flush(self) -> None:
        pass


def local_executors(spec: WorkerSpec, device: torch.device | None = None) \
        -> list[StageExecutor]:
    """One executor per rank of ``spec``'s layout (``spec.rank`` is ignored)."""
    import dataclasses

    replicas = spec.system.replicas
    if any(r > 1 for r in replicas):
        raise UserInputError("in-process runs cover unreplicated pipelines only; config "
                             f"{'-'.join(map(str, replicas))} replicates a stage")
    mailbox: dict = defaultdict(list)
    out = []
    for rank in range(sum(replicas)):
        rank_spec = dataclasses.replace(spec, rank=rank, local_rank=rank)
        ex = StageExecutor(WorkerPieces.build(rank_spec, device or torch.device("cpu")))
        ex.comm = LocalComm(rank, mailbox)
        out.append(ex)
    return out


def run_local(executors: list[StageExecutor], epoch: int) -> list[EpochReport]:
    """One epoch of every rank, interleaved in this process; reports in rank order."""
    play_epoch(executors, epoch)
    return [ex.finish_epoch() for ex in executors]


def play_epoch(executors: list[StageExecutor], epoch: int) -> None:
    """Every rank's actions of one epoch, interleaved; the epoch is not yet closed (each
    executor's ``finish_epoch`` gives its report)."""
    acts = [ex.begin_epoch(epoch) for ex in executors]

    def step(rank: int, pos: int, a: Action) -> bool:
        ex = executors[rank]
        if a.kind in ("RF", "RB", "RT") and not ex.comm.ready(a.peer, a.kind[1]):
            return False
        if a.kind == "U" and ex.clip_globally:  # every rank's norm first (clipping.py)
            if ex.comm.norms_posted == ex.comm.norms_used:
                ex.comm.post_norm(sq_norm(ex.gather_grads()))
            if not ex.comm.norm_ready(len(executors)):
                return False
        ex.step(a, pos)
        return True

    interleave(acts, step)


def typical_messages(executors: list[StageExecutor]) -> dict[tuple[int, str], list[tuple]]:
    """(sending stage, "F" or "B") -> the tensors ((dtype, shape) each) of the median-sized
    message that stage sent that way (shapes vary per batch for text workloads)."""
    out = {}
    for ex in executors:
        for (_, kind), msgs in ex.comm.messages.items():
            by_size = sorted(msgs, key=lambda m: sum(math.prod(s) * d.itemsize for d, s in m))
            out[(ex.stage, kind)] = by_size[len(by_size) // 2]
    return out


def action_costs(reports: list[EpochReport], executors: list[StageExecutor]) \
        -> dict[int, dict[str, float]]:
    """Mean seconds per action of each kind, per stage (F, B, U; SF/SB are local copies
    here, not transfers)."""
    out: dict[int, dict[str, float]] = {}
    for rep, ex in zip(reports, executors, strict=True):
        counts: dict[str, int] = defaultdict(int)
        for a in ex.schedule().actions[ex.spec.rank]:
            counts[a.kind] += 1
        out[ex.stage] = {k: s / counts[k] for k, s in rep.action_s.items() if counts[k]}
    return out
