"""``reproduce schedules`` cells (harness/sim/schedule_table.py) and their words
(schedule_text.py) on synthetic profiles whose backward is twice the forward, with free
transfers: on equal layers, each schedule's bubble and staleness against its closed form
and the row summary naming the winner; on a GPT-like profile (a head four times a layer,
tied to the first layer), the bound its one big layer puts on every straight pipeline,
where the tie lands, and the row's text; and the committed results/schedules.md's GPT
rows against the numbers of results/schedules.json and the committed profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import systems
from harness.sim import schedule_table as st
from harness.sim.profile_source import OWN
from harness.sim.schedule_text import summary
from harness.sim.simulator import SimLayout
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile, load_profile

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
    a, b = sorted(cells.values(), key=lambda c: -c["throughput_samples_s"])[:2]
    head = "**W on 2** (ideal ring all-reduce): "
    if a["throughput_samples_s"] < 1.005 * b["throughput_samples_s"]:  # one layout: a tie
        assert summary(row).startswith(f"{head}{a['system']} and {b['system']} tie")
    else:
        assert summary(row).startswith(f"{head}{a['system']} wins")
    # a clear winner is named as one
    fast = {**a, "throughput_samples_s": 2 * a["throughput_samples_s"]}
    assert summary({**row, "cells": [fast, b]}).startswith(f"{head}{a['system']} wins, +")


# a GPT-like profile: seven equal layers, then a head of four times their compute whose
# weight is the first layer's (tied); on 4 stages its stage alone sets the pace
HEAD = 4 * 30.0
TOTAL = 7 * 30.0 + HEAD


def _head_heavy() -> Profile:
    nodes = tuple(Node(f"n{i}", f"Layer{i}", 10.0, 20.0, (1e3,), 4e3) for i in range(7))
    nodes += (Node("n7", "Head", HEAD / 3, 2 * HEAD / 3, (1e3,), 4e3),)
    edges = tuple((f"n{i}", f"n{i + 1}") for i in range(7))
    return Profile(nodes, edges, batch_size=32,
                   extra={"ties": [{"layers": ["n0", "n7"], "bytes": 4e3}]})


@pytest.fixture(scope="module")
def head_row() -> dict:
    prof = _head_heavy()
    cluster = Cluster((Level(4, 1e15),))
    cells = [st.cell(prof, cluster, s, 16, 1.0) for s in systems.COMPARED]
    return {"workload": st.LM_WORKLOADS[0], "cluster": "4", "allreduce": "ideal ring",
            "profile": "synthetic", "batch": 32, "parameter_bytes": 8 * 4e3,
            "largest_layer": st.largest_layer(prof), "ties": prof.extra["ties"],
            "cells": cells}


def test_a_stage_holding_one_big_layer_bounds_every_straight_pipeline(head_row: dict) -> None:
    """Closed form: the head's stage takes HEAD per minibatch and the mean worker computes
    TOTAL / 4 of it, so no straight pipeline idles less than 1 - TOTAL / (4 HEAD); 2BW,
    which never flushes, idles exactly that."""
    bound = 1 - TOTAL / (4 * HEAD)
    straight = {c["system"]: c for c in head_row["cells"]
                if systems.get(c["system"]).straight and "error" not in c
                and systems.get(c["system"]).stages_per_rank == 1}
    assert straight
    for c in straight.values():
        assert max(c["stage_shares"]) == pytest.approx(HEAD / TOTAL)
        assert c["bubble"] >= bound - 1e-9, c["system"]
    two_bw = next(s for s in straight if systems.get(s).sim == "2bw")
    assert straight[two_bw]["bubble"] == pytest.approx(bound, abs=1e-9)
    text = summary(head_row)
    assert (f"holds its last layer alone, {HEAD / TOTAL:.0%} of the compute (1/4 = 25%), so "
            f"a straight pipeline idles at least {bound:.0%} of each period") in text


def test_where_a_tied_weight_lands_and_which_runs_would_refuse_it(head_row: dict) -> None:
    tie = {c["system"]: c["tie"] for c in head_row["cells"] if "error" not in c}
    for name, status in tie.items():
        s = systems.get(name)
        if s.kind == "data-parallel":  # the whole model on every worker
            assert status == "one stage", name
        elif not s.syncs_ties:  # the peers: each stage steps its own copy
            assert status == "refused: engine", name
        elif s.straight:  # the first and the last of several unreplicated stages
            assert status == "synced", name
    lay = SimLayout([("n0",), ("n1", "n7")], (2, 1))
    ours = next(s for s in systems.COMPARED if systems.get(s).replicated_stages)
    assert st.tie_status(lay, ours, ["n0", "n7"]) == "refused: replicated stage"
    assert st.tie_status(SimLayout([("n0", "n7")], (2,)), ours, ["n0", "n7"]) == "one stage"
    text = summary(head_row)
    refused = sorted(n for n, t in tie.items() if t == "refused: engine")
    assert all(f"{n} (engine)" in text for n in refused)
    assert "exchanges its gradient, 3.9 KiB each way per minibatch" in text


RESULTS = Path(__file__).resolve().parents[3] / "results"


def test_the_committed_gpt_rows_say_what_their_numbers_say() -> None:
    """results/schedules.md (generated) against results/schedules.json and the committed
    CPU profiles: a row per GPT workload and cluster; its line names the fastest system
    and the margin over the second, and the straight split's idle bound recomputed here;
    no straight pipeline's bubble is below that bound; the largest layer's share is the
    profile's."""
    table = json.loads((RESULTS / "schedules.json").read_text())
    md = (RESULTS / "schedules.md").read_text().splitlines()
    gpt = [r for r in table if r["workload"] in st.LM_WORKLOADS]
    assert sorted((r["workload"], r["cluster"]) for r in gpt) == \
        sorted((w, c) for w in st.LM_WORKLOADS for c in st.LM_CLUSTERS)
    for r in gpt:
        line = next(x for x in md if x.startswith(f"- **{r['workload']} on {r['cluster']}**"))
        ok = sorted((c for c in r["cells"] if "error" not in c),
                    key=lambda c: -c["throughput_samples_s"])
        a, b = ok[0], ok[1]
        assert a["throughput_samples_s"] == max(c["throughput_samples_s"] for c in ok)
        margin = a["throughput_samples_s"] / b["throughput_samples_s"] - 1
        assert (f"{a['system']} and {b['system']} tie" if margin < 0.005
                else f"{a['system']} wins, {margin:+.0%} over {b['system']}") in line
        straight = st.straight_cells(r["cells"])
        shares = straight[0]["stage_shares"]
        assert sum(shares) == pytest.approx(1.0)
        bound = 1 - 1 / (len(shares) * max(shares))
        assert f"idles at least {bound:.0%} of each period" in line
        assert all(c["bubble"] >= bound - 1e-6 for c in straight)
        wl, batch = OWN[r["workload"]]
        prof = load_profile(RESULTS / "profiles" / f"{wl}-full-b{batch}-cpu.json")
        ms = [n.forward_ms + n.backward_ms for n in prof.layers]
        assert r["largest_layer"]["share"] == pytest.approx(max(ms) / sum(ms))
        refused = any(c.get("tie", "").startswith("refused") for c in ok)
        assert ("a run would be refused" in line) == refused
