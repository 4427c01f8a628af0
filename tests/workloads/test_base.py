"""workloads/base.py: the tuple-layer interface every pipeline stage relies on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.errors import WorkloadError
from workloads.awd_lm import tied_parameters
from workloads.base import LayerModel, Wrap, count_parameters, run_layers, to_device
from workloads.registry import WORKLOADS, get


def test_wrap_passes_extra_tensors_through_and_disables_inplace() -> None:
    relu = nn.ReLU(inplace=True)
    layer = Wrap(relu)
    assert relu.inplace is False
    x, extra = torch.tensor([-1.0, 2.0]), torch.tensor([7])
    y, e = layer((x, extra))
    assert torch.equal(y, torch.tensor([0.0, 2.0])) and e is extra


def test_run_layers_rejects_a_layer_that_returns_a_bare_tensor() -> None:
    class Bare(nn.Module):
        def forward(self, inputs: tuple) -> torch.Tensor:
            return inputs[0]

    with pytest.raises(TypeError, match="Bare returned Tensor, expected a tuple"):
        run_layers([Bare()], (torch.zeros(1),))


def test_count_parameters_counts_a_tied_tensor_once() -> None:
    a = nn.Linear(3, 3, bias=False)
    b = nn.Linear(3, 3, bias=False)
    b.weight = a.weight
    assert count_parameters(nn.ModuleList([a, b])) == 9
    assert tied_parameters(nn.ModuleList([a, b])) == [["0.weight", "1.weight"]]


def test_registry_lists_the_workloads_and_rejects_unknown_names() -> None:
    assert sorted(WORKLOADS) == ["awd-lm", "gnmt16", "gnmt8", "gpt", "gpt-llama", "resnet50",
                                 "s2vt", "vgg16"]
    assert get("GNMT-8").name == "gnmt8"
    assert get("llama").name == "gpt-llama"
    with pytest.raises(WorkloadError, match="unknown workload 'bert'.*vgg16"):
        get("bert")
    with pytest.raises(WorkloadError, match="unknown scale 'huge'"):
        get("vgg16").spec("huge")


def test_stage_is_a_view_of_the_same_layers() -> None:
    m = LayerModel([Wrap(nn.Linear(2, 2)), Wrap(nn.Linear(2, 2))])
    assert m.stage(1, 2).layers[0] is m.layers[1]


def test_to_device_on_the_cpu_is_a_plain_copy() -> None:
    t = torch.arange(6).reshape(2, 3)
    assert torch.equal(to_device(t, "cpu"), t)


@pytest.mark.gpu
def test_to_device_does_not_wait_for_queued_kernels_and_keeps_the_values() -> None:
    """A copy from pageable memory would wait for the stream to drain: the queued sleep
    would be over when it returns. Through pinned memory it returns at once, and the copy
    still runs after the sleep, from a buffer the caller's later writes do not touch."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    host = torch.randn(1 << 20)
    want = host.clone()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of device time, queued
    slept = torch.cuda.Event()
    slept.record()
    dev = to_device(host, "cuda")
    assert not slept.query()  # returned before the queued kernel ran out
    host.zero_()
    torch.cuda.synchronize()
    assert dev.is_cuda and torch.equal(dev.cpu(), want)
