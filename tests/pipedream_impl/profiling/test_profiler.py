"""pipedream_impl/profiling/profiler.py on tiny workloads."""

from __future__ import annotations

import pytest
import torch

from pipedream_impl.profiling.profiler import profile_workload, whole_step_ms
from workloads.registry import get


@pytest.mark.parametrize("name", ["vgg16", "gnmt8"])
def test_profile_times_and_exact_bytes(name: str) -> None:
    w = get(name)
    prof = profile_workload(w, "tiny", 16, torch.device("cpu"), warmup=2, steps=4)
    data = w.default_data("tiny", 0)
    model = w.build("tiny", {**data.train.meta, "init_seed": 0})
    batch = w.make_batch(data.train, torch.arange(16))
    assert len(prof.layers) == len(model) and prof.batch_size == 16
    assert all(n.forward_ms > 0 for n in prof.layers)
    assert all(n.backward_ms >= 0 for n in prof.layers)
    assert sum(n.backward_ms for n in prof.layers) > 0
    # bytes equal the tensors' sizes exactly
    x = batch.inputs
    with torch.no_grad():
        for node, layer in zip(prof.layers, model.layers, strict=True):
            x = layer(x)
            assert node.activations == tuple(float(t.numel() * t.element_size()) for t in x)
            assert node.parameter_bytes == sum(p.numel() * 4 for p in layer.parameters())
    # the per-layer sum is within a sensible margin of a whole-model step; each the fastest
    # of three, interleaved: one whole step (and once the profile, 2.7x) timed in a slow
    # stretch of a shared machine (the tests run two at once) left the margin, with
    # nothing wrong in the profile
    totals, wholes = [], []
    for i in range(3):
        again = prof if i == 0 else profile_workload(w, "tiny", 16, torch.device("cpu"),
                                                     warmup=2, steps=4)
        totals.append(sum(n.forward_ms + n.backward_ms for n in again.layers))
        wholes.append(whole_step_ms(model, batch, w.loss, torch.device("cpu"), warmup=2,
                                    steps=4))
    total, whole = min(totals), min(wholes)
    assert 0.4 < total / whole < 2.5, (total, whole)
