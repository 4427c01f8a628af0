"""workloads/recipe.py: peak memory is the peak since the last reset, so one process that
runs several trainings (a suite's one-process cells) reports each its own."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
import torch

from workloads.recipe import peak_memory_bytes, reset_peak_memory

# The kernel counts a process's resident pages in per-CPU batches, so VmRSS and VmHWM are
# read some hundred pages off (seen here: up to about 1 MiB short), and code the reading
# itself first runs after the peak is taken off too (``peak_memory_bytes``): a lower bound
# gets this much room, far below the 64-100 MiB each test touches.
SLACK = 2 * 2**20


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="the kernel offers no resettable resident-set peak here")
def test_a_reset_forgets_an_earlier_peak() -> None:
    cpu = torch.device("cpu")
    reset_peak_memory(cpu)  # (what earlier tests left resident is not this test's)
    big = torch.ones(50_000_000)  # 190.7 MiB, touched
    with_big = peak_memory_bytes(cpu)
    del big
    reset_peak_memory(cpu)
    after = peak_memory_bytes(cpu)
    assert with_big - after >= 0.9 * 50_000_000 * 4
    # 38 MiB, touched (library code first run after a peak, part of a MiB here, is taken
    # from the figure: recipe.peak_memory_bytes)
    small = torch.ones(10_000_000)
    assert peak_memory_bytes(cpu) >= after + 0.9 * 40_000_000
    del small


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="the kernel offers no resettable resident-set peak here")
def test_after_a_reset_the_peak_is_what_the_training_added_not_the_libraries() -> None:
    """The interpreter and torch (hundreds of MiB resident) are not counted: right after a
    reset the peak is near zero, and a touched 100 MiB tensor is what it then shows."""
    cpu = torch.device("cpu")
    reset_peak_memory(cpu)
    assert peak_memory_bytes(cpu) < 16 * 2**20
    big = torch.ones(25 * 2**20)  # 100 MiB, touched
    got = peak_memory_bytes(cpu)
    assert 100 * 2**20 - SLACK <= got < 116 * 2**20
    del big


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="the kernel offers no resettable resident-set peak here")
def test_memory_an_earlier_run_freed_is_counted_again_by_the_next() -> None:
    """A suite runs one-process cells one after another: 100 MiB of small tensors (from
    the C heap, below its mmap threshold) freed by one run and allocated again by the next
    count in the next run's peak (freed heap pages stay resident unless handed back)."""
    cpu = torch.device("cpu")
    chunks = [torch.ones(16 * 1024) for _ in range(1600)]  # 64 KiB each, 100 MiB
    del chunks
    reset_peak_memory(cpu)
    again = [torch.ones(16 * 1024) for _ in range(1600)]
    assert peak_memory_bytes(cpu) >= 0.8 * 100 * 2**20
    del again


@contextlib.contextmanager
def _mapped(path) -> Iterator[None]:  # noqa: ANN001
    """``path`` mapped, its every page touched (resident in this process), until the end
    of the block."""
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert sum(m[i] for i in range(0, len(m), mmap.PAGESIZE)) >= 0
        yield


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="the kernel offers no resettable resident-set peak here")
def test_library_code_mapped_in_after_a_reset_is_not_the_trainings(tmp_path) -> None:  # noqa: ANN001
    """A worker forked from a fork server maps its libraries' code in as it first runs it:
    64 MiB of a shared object mapped in after the reset do not count; 64 MiB of a data file
    read through a mapping (a memory-mapped dataset) do, as the process's own memory does."""
    cpu = torch.device("cpu")
    library, data = tmp_path / "libcode.so.1", tmp_path / "tokens.bin"
    for path in (library, data):
        path.write_bytes(os.urandom(64 * 2**20))
    reset_peak_memory(cpu)
    with _mapped(library):
        assert peak_memory_bytes(cpu) < 16 * 2**20
        with _mapped(data):
            assert 64 * 2**20 - SLACK <= peak_memory_bytes(cpu) < 80 * 2**20
