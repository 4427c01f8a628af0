"""Is a resumed run on a GPU the same as an uninterrupted one, and is an uninterrupted one
the same as itself? The measurement behind results/gpu/resilience.md.

Runs the in-process 2-stage PipeDream pipeline (tiny VGG-16, 2 epochs of 4 minibatches) on
CUDA three times: twice straight through, once restored from the checkpoint state after
epoch 0, and prints how many tensors (weights, optimizer state) differ and by how much.

    python3 scripts/gpu_determinism_probe.py default|cudnn|strict

``cudnn``: cuDNN's deterministic algorithms; ``strict``: also
``torch.use_deterministic_algorithms(True)`` (set CUBLAS_WORKSPACE_CONFIG=:4096:8).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipedream_impl.runtime.contract import (  # noqa: E402
    RunSettings,
    SystemSettings,
    WorkerSpec,
    flat_tensors,
)
from pipedream_impl.runtime.local import local_executors, run_local  # noqa: E402


def two_epochs(resume: bool) -> dict[str, torch.Tensor]:
    spec = WorkerSpec(0, RunSettings("vgg16", "tiny", 1, 32, max_steps=4, device="cuda"),
                      SystemSettings((1, 1), ((0, 12), (12, 40))))
    executors = local_executors(spec, torch.device("cuda"))
    run_local(executors, 0)
    if resume:
        saved = [e.checkpoint_state() for e in executors]
        executors = local_executors(spec, torch.device("cuda"))
        for e, s in zip(executors, saved, strict=True):
            e.load_checkpoint(s)
    run_local(executors, 1)
    return flat_tensors([e.checkpoint_state() for e in executors])


def diff(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> str:
    bad = [k for k in x if not torch.equal(x[k], y[k])]
    worst = max((float((x[k].double() - y[k].double()).abs().max()) for k in bad),
                default=0.0)
    return f"{len(bad)}/{len(x)} tensors differ, max |diff| {worst:.3g}"


def main(mode: str) -> None:
    if mode in ("cudnn", "strict"):
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    if mode == "strict":
        torch.use_deterministic_algorithms(True)
    a, b, c = two_epochs(False), two_epochs(False), two_epochs(True)
    print(f"{mode}: uninterrupted twice: {diff(a, b)} | resumed vs uninterrupted: "
          f"{diff(a, c)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "default")
