"""workloads/recipe.py: peak memory is the peak since the last reset, so one process that
runs several trainings (a suite's one-process cells) reports each its own."""

from __future__ import annotations

import os

import pytest
import torch

from workloads.recipe import peak_memory_bytes, reset_peak_memory


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                    reason="the kernel offers no resettable resident-set peak here")
def test_a_reset_forgets_an_earlier_peak() -> None:
    cpu = torch.device("cpu")
    big = torch.ones(50_000_000)  # 190.7 MiB, touched
    with_big = peak_memory_bytes(cpu)
    del big
    reset_peak_memory(cpu)
    after = peak_memory_bytes(cpu)
    assert with_big - after >= 0.9 * 50_000_000 * 4
    small = torch.ones(1_000_000)
    assert peak_memory_bytes(cpu) >= after  # a peak never falls without a reset
    del small
