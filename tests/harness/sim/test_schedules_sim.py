"""The simulator on PipeDream-Flush and PipeDream-2BW (``pipebench simulate --system
pipedream-flush|pipedream-2bw``): their bubbles against the published closed forms on a
synthetic profile of equal stages with equal forward and backward times, free transfers."""

from __future__ import annotations

import pytest

from harness.sim.simulator import SimLayout, SimOptions, simulate_system
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile

F = B = 0.010  # seconds per stage per minibatch (the profile's batch), forward = backward


def _uniform(p: int) -> tuple[Profile, SimLayout, Cluster]:
    nodes = tuple(Node(f"n{i}", f"Layer{i}", F * 1e3, B * 1e3, (1e6,), 4e6) for i in range(p))
    edges = tuple((f"n{i}", f"n{i + 1}") for i in range(p - 1))
    layout = SimLayout([(f"n{i}",) for i in range(p)], (1,) * p)
    return Profile(nodes, edges, batch_size=32), layout, Cluster((Level(p, 1e18),))


def _bubble(r) -> float:  # noqa: ANN001 - SimResult
    return 1 - sum(r.utilisation.values()) / len(r.utilisation)


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_flush_bubble_is_p_minus_1_over_m_plus_p_minus_1(p: int, m: int) -> None:
    """Each minibatch takes (m + p - 1) microbatch slots of (F + B) / m: the bubble is
    (p - 1) / (m + p - 1) of the time, an overhead of (p - 1) / m over the ideal F + B."""
    prof, layout, cluster = _uniform(p)
    r = simulate_system(prof, cluster, "pipedream-flush", layout,
                        SimOptions(minibatches=16, microbatches=m))
    assert r.time_per_minibatch_s == pytest.approx((F + B) * (m + p - 1) / m)
    assert r.time_per_minibatch_s / (F + B) - 1 == pytest.approx((p - 1) / m)
    assert _bubble(r) == pytest.approx((p - 1) / (m + p - 1))
    assert [x["weight_versions"] for x in r.peak_memory.values()] == [1] * p


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [4, 8])
def test_2bw_runs_at_the_ideal_rate_with_two_versions(p: int, m: int) -> None:
    """No flush: in steady state a minibatch takes F + B, the whole run fills and drains
    once: bubble (p - 1) / (n m + p - 1) over n minibatches; two weight versions."""
    n = 16
    prof, layout, cluster = _uniform(p)
    r = simulate_system(prof, cluster, "pipedream-2bw", layout,
                        SimOptions(minibatches=n, microbatches=m))
    assert r.time_per_minibatch_s == pytest.approx(F + B)
    assert r.total_s == pytest.approx((n * m + p - 1) * (F + B) / m)
    assert _bubble(r) == pytest.approx((p - 1) / (n * m + p - 1))
    assert [x["weight_versions"] for x in r.peak_memory.values()] == [2] * p


@pytest.mark.cli
@pytest.mark.parametrize("system", ["pipedream-flush", "pipedream-2bw"])
def test_the_cli_simulates_both(system: str, tmp_path) -> None:  # noqa: ANN001
    import subprocess
    import sys

    prof, _, _ = _uniform(2)
    path = tmp_path / "profile.json"
    path.write_text(prof.to_json())
    out = subprocess.run([sys.executable, "-m", "harness.cli", "simulate", "--profile",
                          str(path), "--system", system, "--cluster", "2", "--minibatches",
                          "16", "--microbatches", "4"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    versions = 2 if system.endswith("2bw") else 1
    assert out.startswith(system) and f"{versions} weight version(s)" in out
