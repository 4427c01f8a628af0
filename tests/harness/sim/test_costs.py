"""harness/sim/costs.py's measured machine: a receiver's own time (``MachineModel.recv_s``)
against closed-form steady states of 1F1B, eager and rendezvous, and in the cores' bound."""

from __future__ import annotations

import pytest

from harness.sim.costs import MachineModel
from harness.sim.simulator import SimLayout, SimOptions, simulate_system
from pipedream_impl.planner.cluster import Cluster, Level
from tests.harness.sim.test_simulator import GROUPS, PROF, chain

COSTS = {0: {"F": 0.010, "B": 0.020, "U": 0.002}, 1: {"F": 0.012, "B": 0.022, "U": 0.004}}
MOVES = {(0, "F"): 0.001, (1, "B"): 0.001}


def _per_minibatch(recv_s: dict, **model) -> float:  # noqa: ANN003 - MachineModel fields
    machine = MachineModel(action_s=COSTS, transfer_s=MOVES, recv_s=recv_s, **model)
    return simulate_system(PROF, Cluster((Level(2, 1e15),)), "pipedream",
                           SimLayout(GROUPS, (1, 1)),
                           SimOptions(minibatches=200, machine=machine)).time_per_minibatch_s


def test_a_receivers_own_time_is_charged_once_its_message_is_in() -> None:
    """Eager transfers hidden: 1F1B runs at its slowest stage's F + B + U plus its own
    receives, stage 1's 38 ms + 3 ms per activation received; then stage 0 (32 ms) with
    12 ms per gradient received is the slower, at 44 ms."""
    assert _per_minibatch({}) == pytest.approx(0.038, rel=0.01)
    assert _per_minibatch({(1, "F"): 0.003}) == pytest.approx(0.041, rel=0.01)
    assert _per_minibatch({(1, "F"): 0.003, (0, "B"): 0.012}) == pytest.approx(0.044, rel=0.01)


def test_under_rendezvous_the_receivers_time_follows_the_transfer() -> None:
    """gloo's rendezvous: stage 1 posts its receive when free, waits the 1 ms transfer,
    then its own 3 ms, computes 38 ms and spends 2 ms in its send: 44 ms a minibatch."""
    own_send = {"rendezvous": True, "send_s": {(0, "F"): 0.0, (1, "B"): 0.002}}
    assert _per_minibatch({}, **own_send) == pytest.approx(0.041, rel=0.01)
    assert _per_minibatch({(1, "F"): 0.003}, **own_send) == pytest.approx(0.044, rel=0.01)


def test_receivers_time_counts_in_the_cores_bound() -> None:
    """Four ranks on two cores: 1F1B takes all ranks' busy time over two cores, 4 x 30 ms
    of compute and, with 5 ms per receive, 3 forward and 3 backward receives more:
    (120 + 30) / 2 ms a minibatch."""
    prof = chain([10.0] * 4, [0.0] * 4, [0.0] * 4)
    costs = {s: {"F": 0.010, "B": 0.020} for s in range(4)}
    recv_s = {(s, k): 0.005 for s in range(4) for k in "FB"}
    r = simulate_system(prof, Cluster((Level(4, 1e15),)), "pipedream",
                        SimLayout([(f"n{i}",) for i in range(4)], (1,) * 4),
                        SimOptions(minibatches=200, machine=MachineModel(
                            action_s=costs, cores=2, recv_s=recv_s)))
    assert r.time_per_minibatch_s == pytest.approx(0.150 / 2, rel=0.01)
