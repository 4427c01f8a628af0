"""Gradient clipping by the whole model's norm across a pipeline's stages.

Why: one process clips the whole model's gradient by its one norm
(``clip_grad_norm_``). A pipeline whose stages each clip their own gradient by their own
norm takes another step whenever the clip fires: a stage whose own norm passes the limit
is scaled alone, and a stage under it is not scaled where the whole model's norm would
have scaled it too. That is a different optimizer, not the same one pipelined (whether it
trains slower is another question: ``results/seeds-gnmt8-tiny*.md``). Megatron-LM and
DeepSpeed all-reduce the squared norm over the pipeline before the optimizer step; so do
we, where every stage updates at one point:

- a schedule that flushes (``ScheduleKind.flushes``: GPipe, 1F1B-Flush, zero bubble,
  interleaved) or keeps one minibatch in flight on unreplicated stages (model
  parallelism): every stage's k-th update applies the same minibatch's gradient, and no
  stage has anything to do before the others reach their k-th update, so the stages'
  squared norms of update k, summed by one scalar all-reduce over every rank
  (``world_sum``; in one process ``local.LocalComm``'s board), are the whole model's.
  The simulator leaves that all-reduce out (8 bytes per update).
- PipeDream's asynchronous 1F1B and 2BW have no such point: each stage updates on its own
  minibatches at its own time, and a blocking sum would stall the pipeline at every
  update. Each stage there clips its own norm, our choice (the original runtime's
  translation script declares a clip of 5.0 and applies none in its training loop:
  msr-fiddle/pipedream, runtime/translation/main_with_runtime.py).
- A split that ties parameters across stages (AWD-LM): the two tied stages clip as
  ``ties`` says (jointly where the schedule flushes, which for a two-stage split is the
  whole model), any other stage by its own norm.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from pipedream_impl.schedule import registry as schedules

__all__ = ["clip_by", "clips_globally", "sq_norm", "world_sum"]


def clips_globally(schedule: str, in_flight: int | None, replicas: tuple[int, ...],
                   clip: float | None) -> bool:
    """Whether a system clips by the whole model's norm (module docstring)."""
    if clip is None:
        return False
    return schedules.get(schedule).flushes or (in_flight == 1 and max(replicas) == 1)


def sq_norm(grads: list[Tensor]) -> Tensor:
    """The squared 2-norm of ``grads`` together (summed in float64), as a float32 scalar."""
    if not grads:
        return torch.zeros(())
    return sum(g.detach().double().pow(2).sum() for g in grads).float()


def clip_by(grads: list[Tensor], total: Tensor, max_norm: float) -> None:
    """Scale ``grads`` in place as ``clip_grad_norm_`` would, given their norm ``total``."""
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.device))


def world_sum(share: Tensor, device: torch.device,
              wait: Callable[[dist.Work], None]) -> Tensor:
    """The sum of every rank's scalar ``share``: one all-reduce over the default group on
    ``device`` (the GPU under NCCL, the CPU under gloo), its work handed to ``wait``."""
    t = share.detach().reshape(1).to(device, torch.float64)
    wait(dist.all_reduce(t, async_op=True))
    return t[0].float()
