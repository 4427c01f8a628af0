"""Single-process reference of the tie rule (pipedream_impl/runtime/ties.py), written apart
from the runtime: one process, every stage a module of its own, minibatches one after
another.

For minibatch t each stage runs its forward with the weight version the schedule's F
action names (weight stashing: the backward uses the same version), on its microbatches in
order, each stage drawing its dropout masks from its own stream seeded as the runtime seeds
that stage's rank; then every stage takes its update t. The two copies of the tied weight
(stage ``a``'s ``name_a``, stage ``b``'s ``name_b``) both apply

    G(t) = g_b(t) + sum of g_a(i) over the i with ``applied_at[i] == t`` (increasing i),

``applied_at`` being given by the caller (the tests pass the closed forms of the rule).
Clipping: ``joint`` clips stages a and b together by one norm in which the tied gradient
counts once, the other stages each by its own norm; otherwise every stage clips its untied
parameters by their norm and the tied gradient by its own.
"""

from __future__ import annotations

import copy

import torch
from torch.func import functional_call

from pipedream_impl.schedule import Schedule
from workloads.base import DataSplits, LayerModel, Workload
from workloads.recipe import dropout_seed, epoch_order, make_optimizer, microbatch

__all__ = ["train_tied"]


def _clip(grads: list[torch.Tensor], max_norm: float) -> None:
    total = torch.sqrt(sum(g.double().pow(2).sum() for g in grads)).float()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)


def train_tied(workload: Workload, scale: str, splits: DataSplits, model: LayerModel,
               bounds, sched: Schedule, tie: tuple[int, str, int, str],
               applied_at: list[int], batch_size: int, seed: int,
               joint: bool) -> list[torch.nn.Module]:
    """The stage modules after one epoch of ``sched.minibatches`` minibatches."""
    spec = workload.spec(scale)
    a, name_a, b, name_b = tie
    stages = [copy.deepcopy(model.stage(lo, hi)) for lo, hi in bounds]
    for st in stages:  # own copies, as the runtime's stages have
        for p in st.parameters():
            p.data = p.data.clone()
    opts = [make_optimizer(spec, st.parameters(), None) for st in stages]
    names = [[n for n, _ in st.named_parameters()] for st in stages]
    history = [{0: {n: p.detach().clone() for n, p in st.named_parameters()}} for st in stages]
    fv = {(sched.layout.stage_of(r)[0], act.mb // sched.microbatches): act.version
          for r, acts in enumerate(sched.actions) for act in acts if act.kind == "F"}
    rng = []
    for s in range(len(stages)):
        torch.manual_seed(dropout_seed(seed, 0, s))
        rng.append(torch.get_rng_state())
    order = epoch_order(len(splits.train), seed, 0)
    m = sched.microbatches
    held: dict[int, torch.Tensor] = {}
    for t in range(sched.minibatches):
        params = [{n: q.clone().requires_grad_() for n, q in history[s][fv[(s, t)]].items()}
                  for s in range(len(stages))]
        for j in range(m):
            batch = microbatch(splits.train, workload, order, t, j, batch_size, m)
            x = batch.inputs
            for s, st in enumerate(stages):
                torch.set_rng_state(rng[s])
                x = functional_call(st, params[s], (x,))
                rng[s] = torch.get_rng_state()
            (workload.loss(x, batch.targets) / m).backward()
        grads = [[params[s][n].grad.clone() if params[s][n].grad is not None
                  else torch.zeros_like(params[s][n]) for n in names[s]]
                 for s in range(len(stages))]
        ia, ib = names[a].index(name_a), names[b].index(name_b)
        held[t] = grads[a][ia]
        tied = grads[b][ib].clone()
        for i in sorted(i for i, u in enumerate(applied_at) if u == t):
            tied += held.pop(i)
        grads[a][ia], grads[b][ib] = tied, tied.clone()
        if spec.grad_clip is not None:
            untied = [[g for k, g in enumerate(gs) if (s, k) not in ((a, ia), (b, ib))]
                      for s, gs in enumerate(grads)]
            for s in range(len(stages)):
                if s not in (a, b):
                    _clip(grads[s], spec.grad_clip)
            if joint:
                both = untied[a] + untied[b] + [tied]
                _clip(both, spec.grad_clip)
                grads[a][ia] = grads[b][ib] = tied
            else:
                _clip(untied[a], spec.grad_clip)
                _clip(untied[b], spec.grad_clip)
                _clip([tied], spec.grad_clip)
                grads[a][ia] = grads[b][ib] = tied
        for s, st in enumerate(stages):
            for p, g in zip(st.parameters(), grads[s], strict=True):
                p.grad = g.clone()
            opts[s].step()
            opts[s].zero_grad(set_to_none=True)
            history[s][t + 1] = {n: p.detach().clone() for n, p in st.named_parameters()}
    assert not held, f"gradients of stage {a} never applied: {sorted(held)}"
    return stages
