"""``gradient_buckets`` against a real DDP: the buckets DDP's reducer holds after its
rebuild (its second step), for each workload the validation runs DDP on: as many, and
each within 1% of the model's bytes of its counterpart."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from baselines.ddp import gradient_buckets
from workloads.recipe import epoch_order, microbatch
from workloads.registry import get


@pytest.fixture
def one_rank_group():  # noqa: ANN201
    """A gloo world of this process alone (DDP needs a process group)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["vgg16", "gnmt8", "gpt-llama"])
def test_buckets_are_the_ones_ddp_reduces_after_its_rebuild(name: str, one_rank_group) -> None:
    wl = get(name)
    splits = wl.default_data("tiny", 0)
    torch.manual_seed(0)
    model = wl.build("tiny", splits.train.meta)
    expected = gradient_buckets(model.parameters())  # before DDP touches the model
    ddp = DistributedDataParallel(model)
    order = epoch_order(len(splits.train), 0, 0)
    for k in range(2):  # the first step runs one bucket; the reducer rebuilds after it
        b = microbatch(splits.train, wl, order, k, 0, 4, 1)
        wl.loss(ddp(b.inputs), b.targets).backward()
    held = [g.buffer().numel() * g.buffer().element_size()
            for g in ddp.reducer._get_zeros_like_grad_buckets()]
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(expected) == sum(held) == total
    # as many buckets, each near its counterpart's size (the validation all-reduces these):
    # a parameter whose gradient is ready out of the layers' order (GNMT's: a bias) may sit
    # in the neighbouring bucket
    assert len(held) == len(expected)
    assert all(abs(h - e) <= 0.01 * total
               for h, e in zip(sorted(held), sorted(expected), strict=True))
