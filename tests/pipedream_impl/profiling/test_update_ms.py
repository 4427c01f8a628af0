"""``profiler.update_ms``: each layer's optimizer step, 0 for a layer without parameters,
weights untouched, and larger for a layer with more parameters (SGD's per-element work)."""

from __future__ import annotations

import torch
from torch import nn

from pipedream_impl.profiling.profiler import update_ms


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.ReLU(), nn.Linear(2000, 2000)])


def test_update_ms_per_layer() -> None:
    torch.manual_seed(0)
    m = _Model()
    before = [p.detach().clone() for p in m.parameters()]
    ms = update_ms(m, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                   torch.device("cpu"), warmup=1, steps=5)
    assert len(ms) == 3 and ms[1] == 0.0
    assert ms[0] > 0 and ms[2] > ms[0]  # 4M elements against 20
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))
    assert all(p.grad is None for p in m.parameters())
