"""Every workload: shapes, published parameter counts, layers composing to the model, and
one optimiser step lowering the loss on a fixed batch."""

from __future__ import annotations

import pytest
import torch

from workloads.base import LayerModel, count_parameters
from workloads.recipe import make_optimizer
from workloads.registry import WORKLOADS

NAMES = sorted(WORKLOADS)


@pytest.fixture(scope="module")
def tiny_data() -> dict:
    return {n: WORKLOADS[n].default_data("tiny", 0) for n in NAMES}


def _batch(name: str, tiny_data: dict, n: int = 8):
    w = WORKLOADS[name]
    return w.make_batch(tiny_data[name].train, torch.arange(n))


@pytest.mark.parametrize("name", [n for n in NAMES if WORKLOADS[n].published_parameters])
def test_full_scale_parameter_count_matches_the_published_model(name: str) -> None:
    w = WORKLOADS[name]
    n = count_parameters(w.build("full", {}))
    assert abs(n - w.published_parameters) / w.published_parameters < 0.01, n


def test_s2vt_full_parameter_count_matches_its_closed_form() -> None:
    from workloads.s2vt import S2VT, parameter_formula

    cfg = S2VT.spec("full").model
    expected = parameter_formula(cfg["vocab"], cfg["feat_dim"], cfg["emb"], cfg["hidden"])
    assert count_parameters(S2VT.build("full", {})) == expected
    assert 35e6 < expected < 40e6  # 4096->500 projection, two 1000-unit LSTMs, 12k words


@pytest.mark.parametrize("name", NAMES)
def test_output_shapes(name: str, tiny_data: dict) -> None:
    w = WORKLOADS[name]
    data = tiny_data[name]
    model = w.build("tiny", data.train.meta).eval()
    b = _batch(name, tiny_data)
    out = model(b.inputs)
    assert len(out) == 1
    vocab_or_classes = data.train.meta.get("vocab_size", data.train.meta.get("num_classes"))
    assert out[0].shape == (*b.targets.shape, vocab_or_classes)


def _origin(model, start: int, stage, params: list) -> list:  # noqa: ANN001
    """The model's parameter behind each of ``params`` (a stage's): the same object, or
    the one it was copied from where the stage copies a tied layer (AWD-LM: a stage
    holding only one side of the tie owns its own copy, so its gradients are summed)."""
    src = {}
    for i, layer in enumerate(stage.layers):
        for (_, q), (_, p) in zip(layer.named_parameters(remove_duplicate=False),
                                  model.layers[start + i].named_parameters(
                                      remove_duplicate=False), strict=True):
            src[id(q)] = p
    return [src[id(q)] for q in params]


@pytest.mark.parametrize("name", NAMES)
def test_every_split_point_composes_to_the_whole_model(name: str, tiny_data: dict) -> None:
    """Any contiguous cut gives two stages whose composition equals the model, in the
    outputs and in every parameter gradient (a tied weight's two copies summed): what
    pipeline stages rely on."""
    w = WORKLOADS[name]
    model = w.build("tiny", tiny_data[name].train.meta).eval()
    b = _batch(name, tiny_data)
    ref = w.loss(model(b.inputs), b.targets)
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    for k in range(1, len(model)):
        head, tail = model.stage(0, k), model.stage(k, len(model))
        boundary = head(b.inputs)
        # What crosses the wire: detached float tensors that require grad, int tensors as-is.
        sent = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in boundary)
        loss = w.loss(tail(sent), b.targets)
        assert torch.allclose(loss, ref, rtol=1e-5, atol=1e-6), (name, k)
        float_sent = [t for t in sent if t.requires_grad]
        tail_params = list(tail.parameters())
        grads = torch.autograd.grad(loss, float_sent + tail_params, allow_unused=True)
        upstream = [g if g is not None else torch.zeros_like(t)
                    for g, t in zip(grads[:len(float_sent)], float_sent, strict=True)]
        float_boundary = [t for t in boundary if t.is_floating_point()]
        head_params = list(head.parameters())
        head_grads = torch.autograd.grad(float_boundary, head_params, upstream,
                                         allow_unused=True)
        combined = {}
        head_origin = _origin(model, 0, head, head_params)
        tail_origin = _origin(model, k, tail, tail_params)
        for p, g in zip(head_origin, head_grads, strict=True):
            combined[id(p)] = g if g is not None else torch.zeros_like(p)
        for p, g in zip(tail_origin, grads[len(float_sent):], strict=True):
            g = g if g is not None else torch.zeros_like(p)
            combined[id(p)] = combined[id(p)] + g if id(p) in combined else g
        for p, g_ref in zip(model.parameters(), ref_grads, strict=True):
            assert torch.allclose(combined[id(p)], g_ref, rtol=1e-4, atol=1e-6), (name, k)


@pytest.mark.parametrize("name", NAMES)
def test_a_static_shapes_workload_keeps_every_boundary_shape(name: str, tiny_data: dict) -> None:
    """``static_shapes`` lets the runtime send each link's shape header once and post the
    next receive ahead: it must hold at every layer boundary (each a possible stage
    boundary) over random microbatches, not only for the inputs."""
    w = WORKLOADS[name]
    if not w.static_shapes:
        pytest.skip(f"{name} declares varying shapes")
    data = tiny_data[name].train
    model = w.build("tiny", data.meta).eval()
    seen = set()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(6):
            out = w.make_batch(data, torch.randperm(len(data), generator=g)[:4]).inputs
            shapes = [tuple((t.dtype, tuple(t.shape)) for t in out)]
            for layer in model.layers:
                out = layer(out)
                shapes.append(tuple((t.dtype, tuple(t.shape)) for t in out))
            seen.add(tuple(shapes))
    assert len(seen) == 1, name


@pytest.mark.parametrize("builder", ["vgg16", "resnet50"])
def test_torchvision_layer_list_equals_the_torchvision_model(builder: str) -> None:
    from torchvision.models import resnet50, vgg16

    from workloads import vision

    torch.manual_seed(0)
    if builder == "vgg16":
        ref = vgg16(weights=None, num_classes=10).eval()
        layers = LayerModel(vision._vgg_layers(ref))
    else:
        ref = resnet50(weights=None, num_classes=10).eval()
        layers = vision.resnet_layers_of(ref)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(layers((x,))[0], ref(x), atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_one_training_step_lowers_the_loss_on_a_fixed_batch(name: str, tiny_data: dict) -> None:
    w = WORKLOADS[name]
    spec = w.spec("tiny")
    model = w.build("tiny", tiny_data[name].train.meta).train()
    b = _batch(name, tiny_data, 16)
    opt = make_optimizer(spec, model.parameters())

    def loss() -> torch.Tensor:
        torch.manual_seed(1)  # the same dropout masks for both evaluations
        return w.loss(model(b.inputs), b.targets)

    before = loss()
    opt.zero_grad()
    before.backward()
    opt.step()
    after = loss()
    assert after.item() < before.item() - 1e-4, (before.item(), after.item())


@pytest.mark.parametrize("name", NAMES)
def test_default_data_is_deterministic(name: str) -> None:
    w = WORKLOADS[name]
    a, b = w.default_data("tiny", 0), w.default_data("tiny", 0)
    for split in ("train", "valid"):
        ta, tb = getattr(a, split), getattr(b, split)
        assert len(ta) == len(tb) > 0
        for k in ta.tensors:
            assert torch.equal(ta.tensors[k], tb.tensors[k]), (name, split, k)
