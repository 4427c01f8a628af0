"""Per-layer profiler on stock PyTorch (no patched hooks; the original needed a patched build).

Each layer runs on its own, on the true inputs it sees inside the model (the previous
layer's outputs, detached, float tensors requiring grad): forward is timed around
``layer(inputs)``, backward around ``torch.autograd.backward(outputs, grads)`` with
unit-variance output gradients; the last layer's timing includes the loss. Times are
averaged over ``steps`` repetitions after ``warmup`` untimed ones, on the device's clock
(``torch.cuda.synchronize`` around each measurement on a GPU). The minibatch is built once
before timing, so data loading is excluded. Python's garbage collector is held off while
timing (as ``timeit`` does): in a process holding many objects (pipebench's launcher,
after importing MLflow and the rest) one full collection took about 0.2 s here, and
landing in one layer's timing it made that layer look several times its cost in the
mean of a few steps, and the stages balanced on that profile lopsided.

Bytes are exact: activation bytes = numel x element size of every tensor a layer returns
(what a stage boundary after it would send, integer tensors riding along included);
parameter bytes = the layer's distinct parameters.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from core.errors import require_int
from pipedream_impl.profiling.graph import Graph, Node
from pipedream_impl.profiling.profile import Profile
from workloads.base import Batch, LayerModel, Workload

__all__ = ["layer_parameter_bytes", "no_collection", "profile_layers", "profile_workload",
           "tensor_bytes", "update_ms", "whole_step_ms"]


def tensor_bytes(tensors: tuple[Tensor, ...]) -> list[float]:
    return [float(t.numel() * t.element_size()) for t in tensors]


def layer_parameter_bytes(layer: torch.nn.Module) -> float:
    seen: dict[int, Tensor] = {id(p): p for p in layer.parameters()}
    return float(sum(p.numel() * p.element_size() for p in seen.values()))


def _timer(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return now
    return time.perf_counter


def _detach(outputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    return tuple(t.detach().requires_grad_(t.is_floating_point()) for t in outputs)


def _time_layers(model: LayerModel, batch: Batch, loss_fn: Callable, now: Callable[[], float],
                 reps: int, warmup: int, into: tuple[list, list, list]) -> None:
    """``reps`` passes over the layers, each alone on the previous one's outputs; from
    the ``warmup``-th on, each layer's forward and backward seconds added to ``into``'s
    lists (and its outputs' bytes kept)."""
    fwd, bwd, acts = into
    n_layers = len(model)
    for rep in range(reps):
        timed = rep >= warmup
        inputs = batch.inputs
        for i, layer in enumerate(model.layers):
            x = _detach(inputs) if i > 0 else inputs
            t0 = now()
            out = layer(x)
            if i == n_layers - 1:
                out_for_grad: tuple[Tensor, ...] = (loss_fn(out, batch.targets),)
            else:
                out_for_grad = tuple(t for t in out if t.requires_grad)
            t1 = now()
            if out_for_grad:
                grads = None if i == n_layers - 1 else [torch.randn_like(t)
                                                         for t in out_for_grad]
                t2 = now()
                torch.autograd.backward(out_for_grad, grads)
                t3 = now()
            else:
                t2 = t3 = 0.0
            if timed:
                fwd[i] += t1 - t0
                bwd[i] += t3 - t2
            acts[i] = tensor_bytes(out)
            inputs = tuple(t.detach() for t in out)
        model.zero_grad(set_to_none=True)


@contextmanager
def no_collection() -> Iterator[None]:
    """Python's garbage collector held off (as it was, after): no collection pause lands
    in a timed span."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def profile_layers(model: LayerModel, batch: Batch, loss_fn: Callable, device: torch.device,
                   warmup: int = 2, steps: int = 5) -> list[Node]:
    model = model.to(device).train()
    batch = batch.to(device)
    now = _timer(device)
    n_layers = len(model)
    fwd = [0.0] * n_layers
    bwd = [0.0] * n_layers
    acts: list[list[float]] = [[] for _ in range(n_layers)]
    with no_collection():
        _time_layers(model, batch, loss_fn, now, warmup + steps, warmup, (fwd, bwd, acts))
    nodes = []
    for i, layer in enumerate(model.layers):
        desc = " ".join(repr(layer).split())[:160]
        nodes.append(Node(f"layer{i}", desc, 1000 * fwd[i] / steps, 1000 * bwd[i] / steps,
                          tuple(acts[i]), layer_parameter_bytes(layer)))
    return nodes


def profile_workload(workload: Workload, scale: str, batch_size: int, device: torch.device,
                     seed: int = 0, warmup: int = 2, steps: int = 5,
                     hardware: str = "") -> Profile:
    require_int("--batch-size", batch_size)
    require_int("--steps", steps)
    require_int("--warmup", warmup, low=0)
    splits = workload.default_data(scale, seed)
    model = workload.build(scale, {**splits.train.meta, "init_seed": seed})
    n = min(batch_size, len(splits.train))
    batch = workload.make_batch(splits.train, torch.arange(n))
    nodes = profile_layers(model, batch, workload.loss, device, warmup, steps)
    return Profile.from_graph(Graph.chain(nodes), workload=workload.name, scale=scale,
                              batch_size=n, device=str(device), hardware=hardware,
                              source="measured")


def whole_step_ms(model: LayerModel, batch: Batch, loss_fn: Callable, device: torch.device,
                  warmup: int = 2, steps: int = 5) -> float:
    """Milliseconds of one forward + loss + backward of the whole model (for checking)."""
    model = model.to(device).train()
    batch = batch.to(device)
    now = _timer(device)
    total = 0.0
    with no_collection():
        for rep in range(warmup + steps):
            t0 = now()
            loss_fn(model(batch.inputs), batch.targets).backward()
            t1 = now()
            if rep >= warmup:
                total += t1 - t0
            model.zero_grad(set_to_none=True)
    return 1000 * total / steps


def update_ms(model: LayerModel, optimizer: Callable[[list], torch.optim.Optimizer],
              device: torch.device, warmup: int = 2, steps: int = 5) -> list[float]:
    """Milliseconds of one optimizer step (``optimizer(params)``, the workload's) over each
    layer's parameters alone, 0 for a layer without any: the per-minibatch update a stage
    makes, which the forward/backward profile leaves out (a stage holding the large fully
    connected layers updates several times longer than one holding the convolutions).
    Gradients are set to ones; the model's weights are left as they were."""
    model = model.to(device)
    now = _timer(device)
    out = []
    for layer in model.layers:
        params = [p for p in layer.parameters() if p.requires_grad]
        if not params:
            out.append(0.0)
            continue
        saved = [p.detach().clone() for p in params]
        for p in params:
            p.grad = torch.ones_like(p)
        opt = optimizer(params)
        total = 0.0
        with no_collection():
            for rep in range(warmup + steps):
                t0 = now()
                opt.step()
                t1 = now()
                if rep >= warmup:
                    total += t1 - t0
        with torch.no_grad():
            for p, w in zip(params, saved, strict=True):
                p.copy_(w)
                p.grad = None
        out.append(1000 * total / steps)
    return out
