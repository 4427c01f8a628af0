"""The workload interface: a model as an ordered list of tuple-in, tuple-out layers.

Why layers of tuples: PipeDream, GPipe and every pipeline baseline cut a model into
contiguous ranges of layers. If every layer takes a tuple of tensors and returns a tuple of
tensors, any range ``layers[i:j]`` is a valid stage whose boundary tensors are exactly what
travels between workers, and running all layers in order is the whole model. Tensors that a
later layer needs (e.g. GNMT's source tokens for the attention mask) simply ride along in the
tuple. Integer tensors (tokens) never need gradients; float tensors do.

A workload knows nothing about workers, pipelines or MLflow (see shared ARCHITECTURE.md).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from core.errors import WorkloadError

__all__ = ["Batch", "DataSplits", "Dataset", "Flatten", "Layer", "LayerModel", "SCALES",
           "STALL_TIMEOUT_S", "ScaleSpec", "TensorData", "Workload", "Wrap",
           "classification_loss", "count_parameters", "cross_entropy_tokens", "run_layers",
           "to_device"]

Tuple = tuple[Tensor, ...]

SCALES = ("tiny", "small", "full")
# The watchdog's default per scale (``Workload.stall_timeout_s``): how long a worker may go
# without finishing an action before the run is declared stuck. Tiny actions take
# milliseconds, a full-scale forward on a CPU tens of seconds; a workload with slower
# actions sets ``ScaleSpec.stall_timeout_s``.
STALL_TIMEOUT_S = {"tiny": 20.0, "small": 60.0, "full": 300.0}


class Layer(nn.Module):
    """Base class of every pipeline layer: ``forward(inputs: tuple) -> tuple``."""

    def forward(self, inputs: Tuple) -> Tuple:  # pragma: no cover - abstract
        raise NotImplementedError


class Wrap(Layer):
    """Lift a single-tensor module (Conv2d, ReLU, ...) to the tuple interface."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        if getattr(module, "inplace", False):
            # A stage's input is a leaf that requires grad; in-place ops on it are illegal.
            module.inplace = False
        self.module = module

    def forward(self, inputs: Tuple) -> Tuple:
        return (self.module(inputs[0]),) + tuple(inputs[1:])

    def extra_repr(self) -> str:
        return ""


class Flatten(Layer):
    def forward(self, inputs: Tuple) -> Tuple:
        return (torch.flatten(inputs[0], 1),) + tuple(inputs[1:])


class LayerModel(nn.Module):
    """The whole model: the layers run in order. ``stage(i, j)`` is layers i..j-1."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, inputs: Tuple) -> Tuple:
        return run_layers(self.layers, inputs)

    def __len__(self) -> int:
        return len(self.layers)

    def stage(self, start: int, stop: int) -> LayerModel:
        """The same layer objects, unless they share a parameter with a layer outside the
        range (a tie, e.g. AWD-LM's embedding and decoder): then a deep copy, so each stage
        owns its copy of the tied weight, initialised identically (a tie inside the range
        stays one parameter; ``pipedream_impl.runtime.ties`` keeps the copies equal)."""
        layers = list(self.layers[start:stop])
        inside = {id(p) for layer in layers for p in layer.parameters()}
        outside = {id(p) for i, layer in enumerate(self.layers) if not start <= i < stop
                   for p in layer.parameters()}
        return LayerModel(copy.deepcopy(layers) if inside & outside else layers)

    def load_stage_state(self, start: int, state: dict[str, Tensor]) -> None:
        """Copy in the weights of a stage that began at layer ``start``: its keys
        ``layers.<i>.<name>`` are this model's ``layers.<start + i>.<name>``."""
        own = self.state_dict()
        for key, value in state.items():
            _, idx, rest = key.split(".", 2)
            own[f"layers.{start + int(idx)}.{rest}"] = value
        self.load_state_dict(own)


def run_layers(layers: Sequence[nn.Module], inputs: Tuple) -> Tuple:
    out = inputs
    for layer in layers:
        out = layer(out)
        if not isinstance(out, tuple):
            raise TypeError(f"layer {type(layer).__name__} returned {type(out).__name__}, "
                            "expected a tuple of tensors")
    return out


def count_parameters(module: nn.Module) -> int:
    """Distinct parameters (a tied parameter counts once)."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


@dataclass(frozen=True)
class ScaleSpec:
    """Hyper-parameters of one scale of a workload (model size, batch, optimiser)."""

    model: dict
    batch_size: int
    lr: float
    target: float
    optimizer: str = "sgd"  # "sgd" (momentum 0.9) or "adam"
    weight_decay: float = 0.0
    grad_clip: float | None = None
    real_target: float | None = None  # the published target on the real dataset (--data)
    epochs: int = 20  # default epoch budget
    stall_timeout_s: float | None = None  # watchdog bound; None: STALL_TIMEOUT_S of the scale


def to_device(t: Tensor, device: torch.device | str) -> Tensor:
    """``t`` on ``device``. A host tensor bound for a CUDA device goes through pinned
    (page-locked) memory with a copy that does not wait: a copy from pageable memory waits
    for the device's stream to drain before it returns, so a minibatch's inputs copied
    after the previous step's kernels were queued held the host until they ran (seen in
    the H100 traces, results/gpu/README.md). The pinned block is torch's caching host
    allocator's, which keeps it until the copy has run; the copy is ordered before any
    later kernel on the same stream."""
    dev = torch.device(device)
    if dev.type != "cuda" or t.device.type != "cpu":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


@dataclass
class Batch:
    """One minibatch: ``inputs`` go to layer 0, ``targets`` to the loss."""

    inputs: Tuple
    targets: Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(tuple(to_device(t, device) for t in self.inputs),
                     to_device(self.targets, device))

    @property
    def size(self) -> int:
        return int(self.targets.shape[0])


class Dataset:
    """A split of a dataset: a length and ``take(index) -> dict of batched tensors``.

    Small datasets live in memory (``TensorData``); large ones (ImageNet) decode on demand.
    ``meta`` carries what the model needs to know (vocabulary, image size, classes).
    """

    meta: dict

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def take(self, index: Tensor, keys: tuple[str, ...] | None = None) \
            -> dict[str, Tensor]:  # pragma: no cover - abstract
        """The rows ``index`` of each column (``keys``: only those columns)."""
        raise NotImplementedError


class TensorData(Dataset):
    def __init__(self, tensors: dict[str, Tensor], meta: dict | None = None) -> None:
        lengths = {k: int(v.shape[0]) for k, v in tensors.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"tensors of different lengths: {lengths}")
        self.tensors = tensors
        self.meta = dict(meta or {})

    def __len__(self) -> int:
        return int(next(iter(self.tensors.values())).shape[0])

    def take(self, index: Tensor, keys: tuple[str, ...] | None = None) -> dict[str, Tensor]:
        return {k: v[index] for k, v in self.tensors.items() if keys is None or k in keys}


@dataclass
class DataSplits:
    train: Dataset
    valid: Dataset
    description: str


@dataclass(frozen=True)
class Workload:
    """Everything a system needs to train a model, independent of how it is parallelised.

    - ``build(scale, data_meta)`` returns the ``LayerModel`` (``data_meta`` carries e.g. the
      vocabulary size of the loaded data).
    - ``loss(outputs, targets)`` is a scalar to minimise (mean over the minibatch).
    - ``evaluate(model, dataset, batch_size)`` returns the quality metric on a split.
    - ``default_data(scale, seed)`` needs no download; ``load_data(path, scale)`` reads the
      real dataset in its usual on-disk format.
    """

    name: str
    description: str
    metric: str  # "top1", "bleu", "meteor", "perplexity"
    higher_is_better: bool
    scales: dict[str, ScaleSpec]
    build: Callable[[str, dict], LayerModel]
    loss: Callable[[Tuple, Tensor], Tensor]
    # make_batch(data, index, targets_only=False): with targets_only, a Batch with no inputs
    # whose targets are read without the inputs (a pipeline's last stage needs only them)
    make_batch: Callable[..., Batch]
    evaluate: Callable[[LayerModel, Dataset, int], float]
    default_data: Callable[[str, int], DataSplits]
    load_data: Callable[[str, str], DataSplits]
    default_data_name: str
    real_data_name: str
    published_parameters: int | None = None  # at scale "full", for the tests
    # every minibatch (and so every inter-stage tensor) has the same shapes: the runtime
    # then sends each link's shape header once instead of with every message and, on
    # gloo, posts each link's next receive ahead (``pipedream_impl.runtime.comm``); a
    # message whose shapes change is then an error, never silent corruption
    static_shapes: bool = False
    # modules its ``build`` imports where it builds a model, too slow to import with the
    # workload (torchvision: seconds); a fork server imports them once for its workers
    # (``workloads.preload``)
    imports: tuple[str, ...] = ()

    def spec(self, scale: str) -> ScaleSpec:
        if scale not in self.scales:
            raise WorkloadError(f"unknown scale {scale!r} for {self.name}; "
                                f"choose one of: {', '.join(self.scales)}")
        return self.scales[scale]

    def stall_timeout_s(self, scale: str) -> float:
        """Seconds a worker may spend in one action before the watchdog ends the run."""
        return self.spec(scale).stall_timeout_s or STALL_TIMEOUT_S[scale]

    def reached(self, quality: float, target: float) -> bool:
        return quality >= target if self.higher_is_better else quality <= target


def cross_entropy_tokens(outputs: Tuple, targets: Tensor, pad: int = 0) -> Tensor:
    """Mean token cross-entropy over non-pad targets; ``outputs[0]`` is [B, T, V] logits."""
    logits = outputs[0]
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       targets.reshape(-1), ignore_index=pad)


def classification_loss(outputs: Tuple, targets: Tensor) -> Tensor:
    return nn.functional.cross_entropy(outputs[0], targets)
