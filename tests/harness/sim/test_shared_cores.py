"""Processor sharing on fewer cores than ranks (harness/sim/shared_cores.py), against
closed forms worked by hand: the fixed point gives every compute action exactly its own
time of a core."""

from __future__ import annotations

import pytest

from harness.sim.shared_cores import stretch
from pipedream_impl.schedule import Action

F = Action("F", 0)


def test_a_staggered_pair_on_one_core_matches_processor_sharing() -> None:
    """Two 1-second actions, the second starting half a second later, on one core: the
    first runs alone for 0.5 s, then both at half speed until the first ends at 1.5 s;
    the second then runs alone and ends at 2.0 s. Both spans are 1.5 s."""
    def run(factors: dict) -> list:
        return [[(0.0, factors.get((0, F), 1.0), F)],
                [(0.5, 0.5 + factors.get((1, F), 1.0), F)]]

    timeline, factors = stretch(run, cores=1)
    assert factors[(0, F)] == pytest.approx(1.5, abs=1e-3)
    assert factors[(1, F)] == pytest.approx(1.5, abs=1e-3)
    assert timeline[1][0][1] == pytest.approx(2.0, abs=1e-3)


def test_three_ranks_at_once_on_two_cores_run_at_two_thirds_and_enough_cores_at_full() \
        -> None:
    def run(factors: dict) -> list:
        return [[(0.0, 0.010 * factors.get((r, F), 1.0), F)] for r in range(3)]

    assert all(f == pytest.approx(1.5, abs=1e-3) for f in stretch(run, cores=2)[1].values())
    assert all(f == pytest.approx(1.0) for f in stretch(run, cores=3)[1].values())
