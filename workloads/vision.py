"""VGG-16 and ResNet-50 as layer lists (torchvision definitions).

At scale ``full`` the models are torchvision's ``vgg16()`` and ``resnet50()`` themselves,
decomposed into layers: every module of VGG's ``features`` and ``classifier`` (as in
PipeDream's VGG-16 profile, one node per conv / ReLU / pool), and for ResNet the stem's
modules, each Bottleneck block, the pooling and the classifier. Smaller scales keep the
architecture (13 convolutions + 3 linear layers; 3-4-6-3 Bottleneck blocks) and divide the
widths and the input size, built from torchvision's own ``make_layers`` and ``Bottleneck``.

torchvision is imported where a model is built, not with this module: importing it takes
about 2 s of CPU here (its operators pull in torch's compiler), and every process that
knows the workloads (a launcher of a GNMT run, a worker of one) imports this module. The
workloads say so (``Workload.imports``), and a fork server imports it once for the workers
it forks (``workloads.preload``).
"""

from __future__ import annotations

import torch
from torch import nn

from workloads import data_images
from workloads.base import (
    Dataset,
    DataSplits,
    Flatten,
    Layer,
    LayerModel,
    ScaleSpec,
    Workload,
    Wrap,
    classification_loss,
)
from workloads.metrics import top1

__all__ = ["RESNET50", "VGG16", "VGG16_CFG", "build_resnet50", "build_vgg16", "evaluate_top1",
           "resnet_layers_of"]

VGG16_CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
             512, 512, 512, "M"]


def _vgg_layers(model: nn.Module) -> list[Layer]:
    layers: list[Layer] = [Wrap(m) for m in model.features]
    layers += [Wrap(model.avgpool), Flatten()]
    layers += [Wrap(m) for m in model.classifier]
    return layers


class _ScaledVGG(nn.Module):
    """torchvision's VGG structure with every width divided by ``div``."""

    def __init__(self, div: int, hidden: int, num_classes: int, dropout: float) -> None:
        from torchvision.models.vgg import make_layers

        super().__init__()
        cfg = [c if c == "M" else max(1, c // div) for c in VGG16_CFG]
        self.features = make_layers(cfg, batch_norm=False)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        last = cfg[-2]
        self.classifier = nn.Sequential(
            nn.Linear(last * 7 * 7, hidden), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(True), nn.Dropout(dropout),
            nn.Linear(hidden, num_classes))
        for m in self.modules():  # torchvision VGG's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.constant_(m.bias, 0)


def build_vgg16(scale: str, meta: dict) -> LayerModel:
    num_classes = int(meta.get("num_classes", 1000))
    cfg = VGG16.spec(scale).model
    torch.manual_seed(int(meta.get("init_seed", 0)))
    if scale == "full":
        from torchvision.models import vgg16

        model = vgg16(weights=None, num_classes=num_classes)
    else:
        model = _ScaledVGG(cfg["div"], cfg["hidden"], num_classes, cfg["dropout"])
    return LayerModel(_vgg_layers(model))


def _resnet_stage(inplanes: int, planes: int, blocks: int, stride: int) -> list[nn.Module]:
    """torchvision's ``ResNet._make_layer`` for Bottleneck blocks."""
    from torchvision.models.resnet import Bottleneck, conv1x1

    downsample = None
    if stride != 1 or inplanes != planes * Bottleneck.expansion:
        downsample = nn.Sequential(conv1x1(inplanes, planes * Bottleneck.expansion, stride),
                                   nn.BatchNorm2d(planes * Bottleneck.expansion))
    out = [Bottleneck(inplanes, planes, stride, downsample)]
    out += [Bottleneck(planes * Bottleneck.expansion, planes) for _ in range(1, blocks)]
    return out


def _init_resnet(modules: list[nn.Module]) -> None:
    for top in modules:
        for m in top.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)


def build_resnet50(scale: str, meta: dict) -> LayerModel:
    from torchvision.models import resnet50
    from torchvision.models.resnet import Bottleneck

    num_classes = int(meta.get("num_classes", 1000))
    cfg = RESNET50.spec(scale).model
    torch.manual_seed(int(meta.get("init_seed", 0)))
    if scale == "full":
        return resnet_layers_of(resnet50(weights=None, num_classes=num_classes))
    w = cfg["width"]
    stem = [nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(True),
            nn.MaxPool2d(3, 2, 1)]
    blocks, inplanes = [], w
    for i, n in enumerate((3, 4, 6, 3)):
        planes = w * 2**i
        blocks += _resnet_stage(inplanes, planes, n, 1 if i == 0 else 2)
        inplanes = planes * Bottleneck.expansion
    _init_resnet(stem + blocks)
    return _resnet_layers(stem, blocks, nn.AdaptiveAvgPool2d((1, 1)),
                          nn.Linear(inplanes, num_classes))


def _resnet_layers(stem: list[nn.Module], blocks: list[nn.Module], pool: nn.Module,
                   fc: nn.Module) -> LayerModel:
    layers: list[Layer] = [Wrap(x) for x in stem] + [Wrap(b) for b in blocks]
    return LayerModel(layers + [Wrap(pool), Flatten(), Wrap(fc)])


def resnet_layers_of(m: nn.Module) -> LayerModel:
    """A torchvision ResNet as layers: stem modules, each block, pooling, classifier."""
    blocks = [b for stage in (m.layer1, m.layer2, m.layer3, m.layer4) for b in stage]
    return _resnet_layers([m.conv1, m.bn1, m.relu, m.maxpool], blocks, m.avgpool, m.fc)


@torch.no_grad()
def evaluate_top1(model: LayerModel, data: Dataset, batch_size: int) -> float:
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    for start in range(0, len(data), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(data)))
        b = data_images.image_batch(data, idx).to(device)
        correct += int(round(top1(model(b.inputs)[0], b.targets) * b.size))
    model.train(was_training)
    return correct / max(1, len(data))


def _default(image_size: dict[str, int]):
    def load(scale: str, seed: int) -> DataSplits:
        return data_images.digits(image_size[scale], seed)
    return load


def _real(image_size: dict[str, int]):
    def load(path: str, scale: str) -> DataSplits:
        return data_images.load_images(path, image_size[scale])
    return load


def _image_workload(name: str, description: str, scales: dict[str, ScaleSpec],
                    build, published: int) -> Workload:
    sizes = {s: spec.model["image_size"] for s, spec in scales.items()}
    return Workload(
        name=name, description=description, metric="top1", higher_is_better=True,
        scales=scales, build=build, loss=classification_loss,
        make_batch=data_images.image_batch, evaluate=evaluate_top1,
        default_data=_default(sizes), load_data=_real(sizes),
        default_data_name="sklearn digits, upsampled (no download)",
        real_data_name="ImageFolder (ImageNet) or CIFAR-10 binaries",
        published_parameters=published, static_shapes=True, imports=("torchvision.models",))




VGG16 = _image_workload(
    "vgg16", "VGG-16 (torchvision), 13 conv + 3 fc",
    {"tiny": ScaleSpec({"div": 8, "hidden": 128, "dropout": 0.0, "image_size": 32}, 32,
                       5e-4, 0.90, optimizer="adam", epochs=40),
     "small": ScaleSpec({"div": 4, "hidden": 512, "dropout": 0.0, "image_size": 64}, 32,
                        5e-4, 0.95, optimizer="adam", epochs=30),
     # The PipeDream paper's VGG-16 target: 68% top-1 on ImageNet.
     "full": ScaleSpec({"div": 1, "hidden": 4096, "dropout": 0.5, "image_size": 224}, 64,
                       0.01, 0.95, weight_decay=5e-4, real_target=0.68, epochs=90)},
    build_vgg16, published=138_357_544)

RESNET50 = _image_workload(
    "resnet50", "ResNet-50 (torchvision), 16 Bottleneck blocks",
    {"tiny": ScaleSpec({"width": 4, "image_size": 32}, 32, 0.05, 0.90, epochs=30),
     "small": ScaleSpec({"width": 16, "image_size": 64}, 32, 0.05, 0.95, epochs=30),
     # MLPerf's ResNet-50 target: 75.9% top-1 on ImageNet.
     "full": ScaleSpec({"width": 64, "image_size": 224}, 64, 0.1, 0.95, weight_decay=1e-4,
                       real_target=0.759, epochs=90)},
    build_resnet50, published=25_557_032)
