"""The machine's own speed, measured beside every benchmark run: a drift reference.

Why: this machine's speed drifts (another tenant, thermal state, memory bandwidth) by more
than the regressions a nightly must catch; a cell measured on a slow night looks like a
regression of ours. A fixed workload that runs none of our code (a torch matmul and
convolution loop, the same every time), timed right before each cell's run on the same
cores, tells how fast the machine was then; the median over a repeat round's cells
(``results.with_drift_cancelled``: one timing is too short to stand alone) is what a cell's
throughput is divided by, and its CPU time per sample multiplied by, to cancel the drift
(``metrics.cancel_drift``).
A regression of ours cannot hide in it: nothing of pipebench runs inside the loop.
"""

from __future__ import annotations

import time

import torch

__all__ = ["REFERENCE_SECONDS", "measure"]

REFERENCE_SECONDS = 0.5  # timed per measurement, after a short warm-up


def _step(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    y = torch.nn.functional.conv2d(x, w, padding=1)
    return float((a @ b).sum()) + float(y.sum())


def measure(threads: int, device: str = "cpu", seconds: float = REFERENCE_SECONDS) -> float:
    """Iterations per second of the fixed loop with ``threads`` torch threads."""
    gen = torch.Generator().manual_seed(0)
    dev = torch.device(device)
    a, b = (torch.randn(256, 256, generator=gen).to(dev) for _ in range(2))
    x = torch.randn(8, 16, 32, 32, generator=gen).to(dev)
    w = torch.randn(16, 16, 3, 3, generator=gen).to(dev)
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        for _ in range(3):
            _step(a, b, x, w)  # warm-up (the float() waits for a GPU)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            _step(a, b, x, w)
            n += 1
        return n / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
