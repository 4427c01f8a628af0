"""Single-process references of the pipeline systems' update rules: PipeDream's (driven by
a schedule's versions, below), whole-minibatch training (``single_process_reference``) and
PipeDream-2BW's delayed update (``two_bw_reference``).

For minibatch t, stage s runs its forward with the weight version its F action names and
its backward with the version its B action names (recomputing the stage's forward on the
stored input), exactly the rule each weight mode defines:
- stash: grad f(w_0^(v_0(t)), ..., w_S^(v_S(t))) with the forward's versions;
- vertical-sync: the same with stage 0's version everywhere;
- none: forward activations at forward-time versions, Jacobians at backward-time versions.
Updates apply in each stage's order; a replicated stage averages one round of minibatches.
Learning rates (``stage_lr``): ``replicas``, PipeDream's rule (msr-fiddle/pipedream
runtime/runtime.py get_adjusted_learning_rate): a stage of r_s replicas updates once per
r_s minibatches with the mean of their gradients at lr x r_s / r_0, so every stage moves
lr / r_0 per minibatch; ``same``: lr on every stage. Computed here from the layout, not by
the runtime's helper.
"""

from __future__ import annotations

import copy

import torch
from torch.func import functional_call

from pipedream_impl.schedule import Schedule
from workloads.base import DataSplits, LayerModel, Workload
from workloads.recipe import epoch_order, make_optimizer, microbatch


def simulate_pipedream(workload: Workload, scale: str, splits: DataSplits, model: LayerModel,
                       bounds, sched: Schedule, batch_size: int, seed: int,
                       lr: float | None = None, stage_lr: str = "replicas") -> LayerModel:
    layout = sched.layout
    stages = [copy.deepcopy(model.stage(a, b)) for a, b in bounds]
    spec = workload.spec(scale)
    base = spec.lr if lr is None else lr
    assert stage_lr in ("replicas", "same"), stage_lr
    # per minibatch every stage moves base / r_0: one step of r_s minibatches at base r_s / r_0
    per_minibatch = base / layout.replicas[0] if stage_lr == "replicas" else None
    opts = [make_optimizer(spec, st.parameters(),
                           base if per_minibatch is None else per_minibatch * r)
            for st, r in zip(stages, layout.replicas, strict=True)]
    history = [{0: {n: p.detach().clone() for n, p in st.named_parameters()}} for st in stages]
    applied = [0] * len(stages)
    pending: list[list[list[torch.Tensor]]] = [[] for _ in stages]
    fv, bv = {}, {}
    for rank, acts in enumerate(sched.actions):
        s, _ = layout.stage_of(rank)
        for a in acts:
            if a.kind == "F":
                fv[(s, a.mb)] = a.version
            elif a.kind == "B":
                bv[(s, a.mb)] = a.version
    order = epoch_order(len(splits.train), seed, 0)
    for t in range(sched.minibatches):
        batch = workload.make_batch(splits.train, order[t * batch_size:(t + 1) * batch_size])
        xs = [batch.inputs]
        with torch.no_grad():
            for s, st in enumerate(stages[:-1]):
                xs.append(functional_call(st, history[s][fv[(s, t)]], (xs[-1],)))
        upstream = None
        for s in range(len(stages) - 1, -1, -1):
            params = {n: p.clone().requires_grad_() for n, p in history[s][bv[(s, t)]].items()}
            x = tuple(v.detach().requires_grad_(v.is_floating_point() and s > 0) for v in xs[s])
            out = functional_call(stages[s], params, (x,))
            if s == len(stages) - 1:
                torch.autograd.backward(workload.loss(out, batch.targets))
            else:
                pairs = [(o, g) for o, g in zip([o for o in out if o.is_floating_point()],
                                                upstream, strict=True) if o.requires_grad]
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            upstream = [v.grad if v.grad is not None else torch.zeros_like(v)
                        for v in x if v.is_floating_point()]
            pending[s].append([params[n].grad for n, _ in stages[s].named_parameters()])
            r = layout.replicas[s]
            if len(pending[s]) == r:
                mean = [torch.stack(gs).mean(0) for gs in zip(*pending[s], strict=True)]
                with torch.no_grad():
                    for p, n in zip(stages[s].parameters(), history[s][applied[s]], strict=True):
                        p.copy_(history[s][applied[s]][n])
                for p, g in zip(stages[s].parameters(), mean, strict=True):
                    p.grad = g
                opts[s].step()
                opts[s].zero_grad(set_to_none=True)
                applied[s] += r
                history[s][applied[s]] = {n: p.detach().clone()
                                          for n, p in stages[s].named_parameters()}
                pending[s] = []
    result = copy.deepcopy(model)
    for s, (a, _) in enumerate(bounds):
        result.load_stage_state(a, history[s][applied[s]])
    return result


def single_process_reference(workload: Workload, splits: DataSplits, steps: int):
    """(model, epoch stats) of single-process training for ``steps`` minibatches of epoch 0:
    the reference that synchronous systems (model parallel, GPipe, DDP) must equal."""
    from harness.config import RunConfig
    from harness.experiments.training import SingleTrainer
    from harness.reporting.progress import quiet

    ref = SingleTrainer(RunConfig.from_flags(system="single", workload=workload.name, threads=1,
                                  max_steps_per_epoch=steps), workload, splits,
                        torch.device("cpu"), quiet())
    stats = ref.train_epoch(0)
    return ref.model, stats


def microbatch_mean_reference(workload: Workload, splits: DataSplits, steps: int, micro: int,
                              lr: float | None = None, clip: float | None = None) \
        -> tuple[LayerModel, list[float]]:
    """(model, the whole model's gradient norm at each step) of single-process training
    whose minibatch loss is the mean of its ``micro`` microbatches' losses (sequence losses
    average over each microbatch's tokens, so this is the update every microbatched
    pipeline computes; it differs from the whole-minibatch mean by the token counts), the
    whole model's gradient clipped by its norm at ``clip`` (None: the workload's)."""
    spec = workload.spec("tiny")
    clip = spec.grad_clip if clip is None else clip
    model = workload.build("tiny", {**splits.train.meta, "init_seed": 0})
    opt = make_optimizer(spec, model.parameters(), lr)
    order = epoch_order(len(splits.train), 0, 0)
    norms = []
    for k in range(steps):
        opt.zero_grad(set_to_none=True)
        for j in range(micro):
            mb = microbatch(splits.train, workload, order, k, j, spec.batch_size, micro)
            (workload.loss(model(mb.inputs), mb.targets) / micro).backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
    return model, norms


RTOL, ATOL = 1e-4, 1e-5  # float32 accumulation noise: the same sums in another order


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` equal to ``want`` within float32 accumulation noise; else the parameter
    ``name`` is named, with its largest difference."""
    assert torch.allclose(got, want, rtol=RTOL, atol=ATOL), (name, (got - want).abs().max())


def assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """``close``, asserted parameter by parameter (``assert_close``)."""
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert_close(na, pa, pb)


def close(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Every parameter of ``a`` equal to ``b``'s within float32 accumulation noise."""
    return all(torch.allclose(pa, pb, rtol=RTOL, atol=ATOL)
               for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


def train_two_workers(workload: Workload, splits: DataSplits, system: str, steps: int,
                      **options) -> LayerModel:
    """One epoch of ``steps`` minibatches of ``system`` on 2 gloo processes (layers 0-12 and
    12-40 of tiny VGG-16's split), 1 thread each; the trained model."""
    from harness.config import RunConfig
    from harness.experiments.pipeline_trainer import PipelineTrainer
    from harness.reporting.progress import quiet

    cfg = RunConfig.from_flags(system=system, workload=workload.name, scale="tiny", workers=2,
                    threads=1, max_steps_per_epoch=steps, epochs=1, timeout_s=60, **options)
    t = PipelineTrainer(cfg, workload, splits, (1, 1), ((0, 12), (12, 40)),
                        torch.device("cpu"), quiet())
    try:
        assert t.train_epoch(0).steps == steps
    finally:
        t.close()
    return t.model


def two_bw_reference(workload: Workload, splits: DataSplits, steps: int,
                     batch: int) -> LayerModel:
    """2BW's rule in one process: minibatch t's gradient (the mean loss over all its
    samples) taken at the weights of one update earlier, given to the workload's optimizer
    at the current weights: W(t+1) = step(W(t), grad f(W(t-1))), W(-1) = W(0)."""
    torch.manual_seed(0)
    model = workload.build("tiny", {**splits.train.meta, "init_seed": 0})
    spec = workload.spec("tiny")
    opt = make_optimizer(spec, model.parameters(), spec.lr)
    names = [n for n, _ in model.named_parameters()]
    order = epoch_order(len(splits.train), 0, 0)
    older = {n: p.detach().clone() for n, p in model.named_parameters()}  # W(-1) = W(0)
    for t in range(steps):
        current = {n: p.detach().clone() for n, p in model.named_parameters()}  # W(t)
        b = workload.make_batch(splits.train, order[t * batch:(t + 1) * batch])
        params = {n: v.clone().requires_grad_() for n, v in older.items()}
        loss = workload.loss(functional_call(model, params, (b.inputs,)), b.targets)
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g
        opt.step()
        opt.zero_grad(set_to_none=True)
        older = current
    return model
