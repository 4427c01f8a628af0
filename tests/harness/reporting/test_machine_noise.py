"""scripts/machine_noise.py: its figures on measurements worked out by hand, and its reading
of the kernel's steal counter.

Why: results/machine-noise.md explains why this machine's verdicts are noisy (issue 23);
its successive change and its share of measurements whose cores did not add up must be
what the report says they are.
"""

from __future__ import annotations

import math

import pytest

from tests.scripts import load_script

mn = load_script("machine_noise")


def test_successive_change_is_the_median_step() -> None:
    # steps: x2, x1, x0.5 (|log| ln2, 0, ln2): median ln2
    assert mn.successive([100.0, 200.0, 200.0, 100.0]) == pytest.approx(math.log(2))
    assert math.isnan(mn.successive([100.0]))


def test_cores_that_do_not_add_up_are_counted() -> None:
    pairs = [(1000.0, 1900.0), (1000.0, 1150.0), (900.0, 1080.0), (1000.0, 1201.0)]
    # 1150 <= 1200 and 1080 <= 1080: two of four; 1201 > 1200 is not
    assert mn.shared_share(pairs) == pytest.approx(0.5)
    text = mn.report(pairs, 0.5, 2, 8.0, 1.0, "cmd")
    assert "in 50% of the measurements" in text
    assert "0.5 s of 16 CPU seconds" in text
    assert "| one thread | 1000 | 900-1000 |" in text


def test_steal_is_the_eighth_counter_of_the_cpu_line() -> None:
    import os

    hz = os.sysconf("SC_CLK_TCK")
    stat = f"cpu  1000 1 200 5000 30 0 7 {3 * hz} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert mn.steal_s(stat) == pytest.approx(3.0)  # not user, idle or any other field
    assert mn.steal_s("cpu  1 2 3 4\n") == 0.0  # a kernel without the field
    assert 0.0 <= mn.steal_s() <= mn.steal_s()  # this machine's, read twice
