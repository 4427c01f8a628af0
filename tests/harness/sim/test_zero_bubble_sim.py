"""The simulator on our ZB-H1 (``pipebench simulate --system zb-h1``): the profile's
backward split into I and W (W half of each weighted layer's backward) and the bubble of
the zero-bubble paper's closed form, on a synthetic profile with T_F = T_I = T_W."""

from __future__ import annotations

import pytest

from harness.sim.simulator import SimLayout, SimOptions, simulate_system
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile

F = 0.010  # seconds per stage per minibatch; B = 2F, so I = W = F


def _run(system: str, p: int, m: int):  # noqa: ANN202 - SimResult
    nodes = tuple(Node(f"n{i}", f"Layer{i}", F * 1e3, 2 * F * 1e3, (1e6,), 4e6)
                  for i in range(p))
    edges = tuple((f"n{i}", f"n{i + 1}") for i in range(p - 1))
    layout = SimLayout([(f"n{i}",) for i in range(p)], (1,) * p)
    return simulate_system(Profile(nodes, edges, batch_size=32), Cluster((Level(p, 1e18),)),
                           system, layout, SimOptions(minibatches=8, microbatches=m))


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_zb_h1_overhead_is_a_third_of_the_flush_pipelines(p: int, m: int) -> None:
    """Time per minibatch over the ideal 3F: (p - 1) / (3m) for ZB-H1, (p - 1) / m for
    PipeDream-Flush on the same split."""
    zb = _run("zb-h1", p, m).time_per_minibatch_s / (3 * F) - 1
    flush = _run("pipedream-flush", p, m).time_per_minibatch_s / (3 * F) - 1
    assert zb == pytest.approx((p - 1) / (3 * m))
    assert flush == pytest.approx((p - 1) / m)


def test_zb_h1_peak_activations_match_1f1b_first_stage() -> None:
    """p microbatches alive on every stage: each stage's peak is 1F1B's stage-0 peak."""
    p, m = 4, 8
    r = _run("zb-h1", p, m)
    per_unit = 1e6 / m  # one microbatch's activations of one stage
    assert [r.peak_memory[w]["activations"] for w in range(p)] == \
        pytest.approx([p * per_unit] * p)
