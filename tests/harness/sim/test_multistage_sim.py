"""The simulator on torch's several-stages-per-worker schedules (``pipebench simulate
--system torch-interleaved-1f1b|torch-zb|torch-zbv|torch-dualpipev``): bubble and memory
against the published closed forms, on a synthetic profile of 2p equal stages with a
backward of twice the forward (so I = W = F: the zero-bubble papers' setting) and free
transfers."""

from __future__ import annotations

import pytest

from harness.sim.simulator import SimLayout, SimOptions, layout_for, simulate_system
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile

F = 0.010  # seconds per stage per minibatch (the profile's batch); B = 2F, I = W = F
V = 2  # stages per worker
ACT = 1e6  # bytes each stage's activations take per minibatch


def _run(system: str, p: int, m: int, fb: float = 2.0, bandwidth: float = 1e18):  # noqa: ANN202
    k = V * p
    nodes = tuple(Node(f"n{i}", f"Layer{i}", F * 1e3, fb * F * 1e3, (ACT,), 4e6)
                  for i in range(k))
    edges = tuple((f"n{i}", f"n{i + 1}") for i in range(k - 1))
    prof = Profile(nodes, edges, batch_size=32)
    layout = SimLayout([(f"n{i}",) for i in range(k)], (1,) * p)
    return simulate_system(prof, Cluster((Level(p, bandwidth),)), system, layout,
                           SimOptions(minibatches=6, microbatches=m))


def _overhead(r, fb: float = 2.0) -> float:  # noqa: ANN001 - SimResult
    """Time per minibatch over the ideal (every worker busy: V stages' F + B)."""
    return r.time_per_minibatch_s / (V * F * (1 + fb)) - 1


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_interleaved_1f1b_bubble_is_p_minus_1_over_v_m(p: int, m: int) -> None:
    """Narayanan et al. (SC 2021): interleaving v stages per worker divides the flush
    schedule's (p - 1) / m overhead by v."""
    assert _overhead(_run("torch-interleaved-1f1b", p, m)) == pytest.approx((p - 1) / (V * m))


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_interleaved_zero_bubble_is_zb_h1_over_v(p: int, m: int) -> None:
    """Qi et al. (ICLR 2024): ZB-H1 leaves (p - 1)(T_F + T_B - T_W) of bubble, with
    T_F = T_B = T_W a third of 1F1B's: (p - 1) / (3 m); ZB1P interleaved over v stages per
    worker divides it by v, as interleaving divides 1F1B's."""
    assert _overhead(_run("torch-zb", p, m)) == pytest.approx((p - 1) / (3 * V * m))


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [8, 16])
def test_zbv_has_no_bubble_and_1f1b_peak_memory(p: int, m: int) -> None:
    """ZB-V (Qi et al., section 4): with T_F = T_B = T_W and m >= 2p microbatches, no
    bubble, and the peak activation memory of 1F1B: p microbatches of a whole worker's
    layers (here 2 stages), on every worker."""
    r = _run("torch-zbv", p, m)
    assert _overhead(r) == pytest.approx(0.0, abs=1e-9)
    per_mb = V * ACT / m
    assert [x["activations"] for x in r.peak_memory.values()] == pytest.approx([p * per_mb] * p)
    assert [x["weight_versions"] for x in r.peak_memory.values()] == [1] * p


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_interleaved_activations_in_flight_follow_megatrons_warmup(p: int, m: int) -> None:
    """Megatron-LM's interleaved schedule: worker r runs 2 (p - 1 - r) + (v - 1) p warm-up
    forwards and one more before its first backward (all v m if fewer): that many stage
    activations of one microbatch are alive at the peak."""
    r = _run("torch-interleaved-1f1b", p, m)
    want = [min(V * m, 2 * (p - 1 - w) + (V - 1) * p + 1) * ACT / m for w in range(p)]
    assert [x["activations"] for x in r.peak_memory.values()] == pytest.approx(want)


def test_a_slow_link_is_charged_and_counted() -> None:
    """Transfers at a finite bandwidth slow the step, and every cut between two workers
    carries each microbatch's activations forward and their gradients back (the V's turn
    on the last worker is local)."""
    p, m = 2, 8
    fast, slow = _run("torch-zbv", p, m), _run("torch-zbv", p, m, bandwidth=1e8)
    assert slow.time_per_minibatch_s > fast.time_per_minibatch_s
    cuts = V * p - 2  # 4 stages on a V over 2 workers: cuts 0|1 and 2|3 cross workers
    assert sum(slow.bytes_per_level.values()) / slow.minibatches == pytest.approx(2 * cuts * ACT)


def test_the_layout_splits_the_model_into_v_stages_per_worker() -> None:
    nodes = tuple(Node(f"n{i}", "L", 1.0, 2.0, (1e3,), 4e3) for i in range(12))
    edges = tuple((f"n{i}", f"n{i + 1}") for i in range(11))
    prof = Profile(nodes, edges, batch_size=8)
    lay = layout_for(prof, Cluster((Level(4, 1e10),)), "torch-interleaved-1f1b", stages=3)
    assert lay.replicas == (1, 1, 1) and [len(g) for g in lay.groups] == [2] * 6
    with pytest.raises(Exception, match="unreplicated"):
        layout_for(prof, Cluster((Level(4, 1e10),)), "torch-zbv", config="2-1")
