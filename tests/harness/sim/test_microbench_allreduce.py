"""The all-reduce microbenchmark the validation's DDP rows are simulated with
(``harness.sim.microbench.measure_allreduce``): real gloo processes give back the elapsed
time and one rank's CPU time of the buckets' all-reduces, both finite and positive (what
the simulator's cores' bound charges is the second; no figure is asserted, only its
kind)."""

from __future__ import annotations

import math

from harness.sim.microbench import measure_allreduce


def test_the_allreduce_gives_its_elapsed_and_cpu_time() -> None:
    elapsed, cpu = measure_allreduce(2, (1 << 20, 4096), reps=3)
    assert math.isfinite(elapsed) and elapsed > 0
    assert math.isfinite(cpu) and cpu > 0
