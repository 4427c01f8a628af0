"""The training recipe every system shares: optimiser, sample order, data, memory reading.

Systems differ only in how they parallelise; these rules make the rest identical (same
optimizer and learning rate, same minibatches in the same order for a given seed and
epoch, same data), so a comparison isolates the system. The harness, the PipeDream runtime
and the baselines all call these functions.
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource
import sys
from collections.abc import Iterator

import torch
from torch import nn

from core.switches import switch
from workloads.base import Batch, Dataset, DataSplits, ScaleSpec, Workload

__all__ = ["FUSED_OPTIMIZER_ENV", "dropout_seed", "epoch_order", "fused_optimizer",
           "load_optimizer_state", "load_splits", "make_optimizer", "microbatch",
           "minibatch", "peak_memory_bytes", "reset_peak_memory"]


FUSED_OPTIMIZER_ENV = "PIPEBENCH_FUSED_OPTIMIZER"  # "0": foreach kernels instead of fused


def fused_optimizer() -> bool:
    """Whether the optimizer steps with fused kernels: ``PIPEBENCH_FUSED_OPTIMIZER`` is ``1``
    (the default, also when unset) or ``0`` (the multi-tensor foreach kernels)."""
    return switch(FUSED_OPTIMIZER_ENV, "1", "fused kernels, the default",
                  "multi-tensor foreach kernels")


def _kernels() -> dict[str, bool | None]:
    """The optimizer's kernel flags, as a parameter group holds them."""
    return {"fused": True, "foreach": None} if fused_optimizer() else \
        {"fused": None, "foreach": True}


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a checkpoint's optimizer ``state`` with this run's kernels: a saved parameter
    group's flags would otherwise replace them (``load_state_dict`` keeps the saved
    groups), and the run would step with the kernels of the run that saved it while its
    ``runtime_env`` says otherwise. Set before loading, so that torch places the state
    (Adam's step count) as these kernels want it."""
    groups = [{**g, **_kernels()} for g in state["param_groups"]]
    optimizer.load_state_dict({**state, "param_groups": groups})


def make_optimizer(spec: ScaleSpec, params: Iterator[nn.Parameter] | list,
                   lr: float | None = None) -> torch.optim.Optimizer:
    """The workload's optimizer over ``params``, stepping with fused kernels (one pass over
    each tensor's weights, gradients and state) unless ``PIPEBENCH_FUSED_OPTIMIZER=0``.
    torch picks the per-tensor loop on the CPU by default, which costs the systems that
    step often (PipeDream steps per minibatch, a flush pipeline once per flush) far more;
    the step's cost by kernels is in results/optimizer-step.md, what it does to each
    system's throughput in results/fused-optimizer-ab-vgg16.md. Fused and foreach steps
    differ in the last bits of the weights; every system of a run uses the same one."""
    lr = spec.lr if lr is None else lr
    kernels = _kernels()
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=spec.weight_decay, **kernels)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=spec.weight_decay,
                               **kernels)
    if spec.optimizer == "sgd-plain":
        return torch.optim.SGD(params, lr=lr, weight_decay=spec.weight_decay, **kernels)
    raise ValueError(f"unknown optimizer {spec.optimizer!r}")


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The sample order of an epoch: the same for every system given (seed, epoch)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def dropout_seed(seed: int, epoch: int, rank: int | None = None) -> int:
    """The torch seed for an epoch's dropout masks: one process (``rank`` None) or one rank
    of a multi-process system (each rank its own stream)."""
    if rank is None:
        return seed * 7919 + epoch
    return seed * 7919 + epoch * 131 + rank


def minibatch(data: Dataset, workload: Workload, order: torch.Tensor, k: int,
              batch_size: int) -> Batch:
    """Minibatch k of an epoch whose sample order is ``order``."""
    return workload.make_batch(data, order[k * batch_size:(k + 1) * batch_size])


def microbatch(data: Dataset, workload: Workload, order: torch.Tensor, k: int, j: int,
               batch_size: int, microbatches: int, targets_only: bool = False) -> Batch:
    """Microbatch j of minibatch k: the minibatch's samples cut into equal consecutive parts
    (``targets_only``: its targets alone, the inputs neither read nor built)."""
    size = batch_size // microbatches
    start = k * batch_size + j * size
    return workload.make_batch(data, order[start:start + size], targets_only=targets_only)


def load_splits(workload: Workload, scale: str, data: str | None, seed: int) -> DataSplits:
    if data is not None:
        return workload.load_data(data, scale)
    return workload.default_data(scale, seed)


_resident_at_reset = 0  # bytes resident at the last reset on the CPU: not the training's
_libraries_at_reset = 0  # of them, the libraries' code and constants (``_library_bytes``)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: a process that runs several trainings one after another (a
    suite's one-process cells) would otherwise report the largest of them all. On the CPU
    writing 5 to /proc/self/clear_refs resets the resident-set high-water mark (Linux), and
    what is resident now is set aside: the interpreter and the libraries are no part of
    what a system's training holds, and their footprint moves between runs of one commit
    by the same amount on every cell (``results/nightly-aa.md``). Nor is the libraries'
    code that the training maps in later, as it first runs it: ``peak_memory_bytes``
    leaves it out (19 MiB of a 41 MiB peak on tiny VGG-16's PipeDream stages, which a
    worker forked from a fork server, ``pipedream_impl.runtime.processes``, maps in anew
    where a spawned one had part of it mapped by its own imports)."""
    global _resident_at_reset, _libraries_at_reset
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    _release_free_memory()  # what earlier trainings freed would be reused unseen
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux: the peak stays the process's, whole
        _resident_at_reset = _libraries_at_reset = 0
        return
    _libraries_at_reset = _library_bytes()
    _resident_at_reset = _status_bytes("VmRSS") or 0


def _library_bytes() -> int:
    """Bytes resident in this process's mappings of shared objects (``*.so*``) and of the
    interpreter: the code and constants of what it runs (0 where /proc/self/smaps is not).
    They only grow while code runs; a data file read through a mapping is not one."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    exe = os.path.realpath(sys.executable)
    total, library = 0, False
    for line in lines:
        if line[:1] in _HEX:  # a mapping's header: range, perms, offset, dev, inode, path
            path = line.split(None, 5)[5:]
            name = path[0].removesuffix(" (deleted)") if path else ""
            library = ".so" in os.path.basename(name) or name == exe
        elif library and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024  # kB
    return total


_HEX = frozenset("0123456789abcdef")  # a smaps field's name starts with a capital


def _release_free_memory() -> None:
    """Hand memory freed to the C allocator back to the OS (glibc's ``malloc_trim``), so
    that a training run after others in one process (a suite's one-process cells) counts
    the pages it uses, not only those beyond what the earlier runs left resident."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: freed memory stays resident


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


def peak_memory_bytes(device: torch.device) -> int:
    """Peak GPU memory allocated by torch, or on the CPU the peak resident set (``VmHWM``)
    above what was resident at the last ``reset_peak_memory`` (the whole peak without
    one), less the libraries' code mapped in since. The kernel keeps no peak of the
    libraries' pages apart, so those mapped in by now are taken from the peak: at least
    those of the peak (they only grow), and the figure never exceeds the training's own
    peak (code first run after the peak makes it fall short by as much)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = _status_bytes("VmHWM")
    if peak is None:
        peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB, Linux
    mapped_in = max(0, _library_bytes() - _libraries_at_reset) if _resident_at_reset else 0
    return max(0, peak - _resident_at_reset - mapped_in)
