"""``reproduce schedules`` cells (harness/sim/schedule_table.py) on a synthetic profile of
equal layers whose backward is twice the forward, with free transfers: each schedule's
bubble and staleness against its closed form, and the row summary naming the winner."""

from __future__ import annotations

import pytest

from harness import systems
from harness.sim import schedule_table as st
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile

P = 2  # workers
M = 4 * P  # the table's microbatches per minibatch


def _profile() -> Profile:
    nodes = tuple(Node(f"n{i}", f"Layer{i}", 10.0, 20.0, (1e3,), 4e3) for i in range(8))
    edges = tuple((f"n{i}", f"n{i + 1}") for i in range(7))
    return Profile(nodes, edges, batch_size=32)


@pytest.fixture(scope="module")
def cells() -> dict[str, dict]:
    prof = _profile()
    cluster = Cluster((Level(P, 1e15),))
    return {s: st.cell(prof, cluster, s, 16, 1.0) for s in systems.COMPARED}


def test_every_compared_schedule_gets_a_cell(cells: dict[str, dict]) -> None:
    assert all("error" not in c for c in cells.values()), cells


@pytest.mark.parametrize("kind, bubble", [
    ("flush", (P - 1) / (M + P - 1)),  # GPipe: the fill and drain of every minibatch
    ("1f1b-flush", (P - 1) / (M + P - 1)),
    ("zbv", 0.0),  # ZB-V with T_F = T_B = T_W and m >= 2p: no bubble
])
def test_bubble_matches_the_closed_form(cells: dict[str, dict], kind: str,
                                        bubble: float) -> None:
    name = next(s for s in systems.COMPARED if systems.get(s).sim == kind)
    assert cells[name]["bubble"] == pytest.approx(bubble, abs=1e-9)


def test_staleness_per_schedule(cells: dict[str, dict]) -> None:
    want = {"flush": 0, "1f1b-flush": 0, "2bw": 1, "data-parallel": 0, "in-flight-1": 0,
            "interleaved-1f1b": 0, "zb": 0, "zbv": 0, "dualpipev": 0}
    for name, c in cells.items():
        sim = systems.get(name).sim
        if sim in want:
            assert c["staleness"] == want[sim], name
    pd = cells[systems.PAPER["planned"]]
    if pd["layout"] == "1-1":  # a straight plan: stage 0 runs 2 minibatches in flight
        assert pd["staleness"] == 1


def test_summary_names_the_fastest(cells: dict[str, dict]) -> None:
    row = {"workload": "W", "cluster": "2", "allreduce": "ideal ring",
           "cells": list(cells.values())}
    best = max(cells.values(), key=lambda c: c["throughput_samples_s"])
    assert st._summary(row).startswith(f"**W on 2** (ideal ring all-reduce): "
                                       f"{best['system']} wins")
