"""harness/sim/calibration.py, reproduce.py and profile_source.py: the calibrated all-reduce
against its closed form written out by hand, the fit's residuals recomputed, the rows and
the JSON schema, and what the GPT CPU profiles are measured on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.sim.calibration import FlatRing, bsp_speedup, link_kind
from harness.sim.costs import Topology
from pipedream_impl.planner.cluster import Cluster, Level, parse_cluster
from pipedream_impl.profiling.graph import Node
from pipedream_impl.profiling.profile import Profile, load_profile

PROFILES = Path(__file__).resolve().parents[4] / "shared" / "pipedream-profiles"
MEASURED = Path(__file__).resolve().parents[3] / "results" / "profiles"  # S2VT, CPU-scaled
needs_profiles = pytest.mark.skipif(not (PROFILES / "vgg16" / "graph.txt").exists(),
                                    reason="needs ../shared/pipedream-profiles")
MB = 1e6
MODEL = FlatRing(pcie=0.02, nvlink=0.002, network=0.5)


def test_the_flat_ring_runs_at_the_slowest_crossed_link() -> None:
    a = parse_cluster("A:2x4")  # 4 x PCIe (15.75 GB/s) per server, 10 Gbps between
    topo = Topology(a, list(range(8)))
    inside = MODEL.seconds(topo, (0, 1, 2, 3), 100 * MB)
    assert inside == pytest.approx(2 * 3 / 4 * 100 * MB / (0.02 * 15.75e9))
    across = MODEL.seconds(topo, tuple(range(8)), 100 * MB)  # min(0.315, 0.625) GB/s
    assert across == pytest.approx(2 * 7 / 8 * 100 * MB / (0.02 * 15.75e9))
    two = MODEL.seconds(topo, (0, 4), 100 * MB)  # one per server: the network only
    assert two == pytest.approx(100 * MB / (0.5 * 1.25e9))
    assert MODEL.seconds(topo, (3,), 100 * MB) == 0.0
    b = parse_cluster("B:1x8")
    assert MODEL.seconds(Topology(b, list(range(8))), tuple(range(8)), 100 * MB) == \
        pytest.approx(2 * 7 / 8 * 100 * MB / (0.002 * 150e9))
    assert [link_kind(bw) for bw in (15.75e9, 150e9, 1.25e9, 5e9)] == \
        ["pcie", "nvlink", "network", "network"]


def test_simulated_bsp_speedup_is_the_closed_form() -> None:
    # one layer of 40 + 80 ms and 200 MB of weights on 4 workers of one A server
    prof = Profile((Node("in", "Input", 9.0, 0.0, (1 * MB,), 0.0),
                    Node("n0", "Linear", 40.0, 80.0, (1 * MB,), 200 * MB)),
                   (("in", "n0"),), batch_size=32)
    cl = parse_cluster("A:1x4")
    ar = 2 * 3 / 4 * 200 * MB / (0.02 * 15.75e9)  # 0.952 s, 0.08 s hidden by the backward
    expected = 4 * 0.120 / (0.120 + ar - 0.080)  # the input's 9 ms is not compute
    assert bsp_speedup(prof, cl, 1.0, MODEL) == pytest.approx(expected, rel=1e-9)
    # ideal: a ring at 15.75 GB/s (0.019 s) is hidden entirely
    assert bsp_speedup(prof, cl, 1.0, None) == pytest.approx(4.0)


@needs_profiles
def test_fit_residuals_recomputed_from_the_profiles_by_hand() -> None:
    from harness.reporting.progress import quiet
    from harness.sim.calibration import fit
    from harness.sim.paper import BSP_SPEEDUPS
    from harness.sim.profile_source import ProfileSource

    f = fit(ProfileSource(str(PROFILES), quiet(), str(MEASURED)).get)
    m = f.model
    assert 0 < m.pcie <= 1 and 0 < m.nvlink <= 1 and 0 < m.network <= 1
    layers = [n for n in load_profile(PROFILES / "vgg16" / "graph.txt").layers
              if n.desc != "Input"]
    t1 = sum(n.forward_ms + n.backward_ms for n in layers) / 1e3
    back = sum(n.backward_ms for n in layers) / 1e3
    w = sum(n.parameter_bytes for n in layers)
    hand = {  # (workers, effective bytes/s of the ring)
        "A:1x4": (4, m.pcie * 15.75e9),
        "A:2x4": (8, min(m.pcie * 15.75e9, m.network * 1.25e9)),
        "A:4x4": (16, min(m.pcie * 15.75e9, m.network * 1.25e9)),
        "B:1x8": (8, m.nvlink * 150e9),
    }
    for point in f.points:
        if point.model != "VGG-16":
            continue
        n, rate = hand[point.cluster]
        s = n * t1 / (t1 + max(0.0, 2 * (n - 1) / n * w / rate - back))
        assert point.simulated == pytest.approx(s, rel=1e-6), point
        assert point.residual == pytest.approx(math.log(s / point.paper))
    assert [(p.model, p.cluster, p.paper) for p in f.points] == list(BSP_SPEEDUPS)
    # least squares: nudging any efficiency by 2% (within its bound) lowers no sum of
    # squared log residuals, each speedup simulated afresh
    from dataclasses import replace

    src = ProfileSource(str(PROFILES), quiet(), str(MEASURED))
    cases = [(src.get(mm)[0], parse_cluster(c), src.get(mm)[2], s) for mm, c, s in BSP_SPEEDUPS]

    def sse(model: FlatRing) -> float:
        return sum(math.log(bsp_speedup(p, cl, fa, model) / s) ** 2 for p, cl, fa, s in cases)

    base = sse(m)
    for kind in ("pcie", "nvlink", "network"):
        for k in (0.98, 1.02):
            v = getattr(m, kind) * k
            if v <= 1:
                assert sse(replace(m, **{kind: v})) >= base - 1e-9, (kind, k)
    assert f.rms < 0.3
    assert "rms log residual" in f.markdown() and "A:4x4" in f.markdown()


@needs_profiles
def test_rows_quote_the_paper_and_data_parallel_configs_are_one() -> None:
    from harness.reporting.progress import quiet
    from harness.sim import reproduce as rp
    from harness.sim.calibration import fit
    from harness.sim.paper import PaperRow
    from harness.sim.profile_source import ProfileSource
    from pipedream_impl.planner.plan import plan_profile

    src = ProfileSource(str(PROFILES), quiet(), str(MEASURED))
    f = fit(src.get)
    row = PaperRow("VGG-16", "A:1x4", "2-1-1", 2.13, "", "", "vgg16", 0.90)
    dp_row = PaperRow("VGG-16", "A:1x4", "4", 1.00, "", "", "vgg16", 0.0)
    out = rp.table_rows((row, dp_row), src, 64, f, quiet())
    assert (out[0]["paper_config"], out[0]["paper_speedup"], out[0]["paper_comm_reduction"]) \
        == ("2-1-1", 2.13, 90.0)
    prof = load_profile(PROFILES / "vgg16" / "graph.txt")
    cl = parse_cluster("A:1x4")
    configs = [plan_profile(prof, c).config for c in (cl, f.model.planner_cluster(cl))]
    assert out[0]["planned_config"] == " / ".join(dict.fromkeys(configs))
    assert (out[1]["simulated_speedup_ideal"], out[1]["simulated_speedup_calibrated"],
            out[1]["simulated_comm_reduction"], out[1]["misses"]) == (1.0, 1.0, 0.0, "")


@needs_profiles
@pytest.mark.cli
def test_reproduce_json_rows_have_the_schema(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "t.json"
    r = subprocess.run([sys.executable, "-m", "harness.cli", "reproduce", "table1",
                        "--profiles", str(PROFILES), "--quiet", "--minibatches", "32",
                        "-o", str(tmp_path / "t.md"), "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    keys = {"model", "cluster", "profile", "paper_config", "paper_speedup",
            "paper_comm_reduction", "simulated_speedup_ideal", "simulated_speedup_calibrated",
            "simulated_comm_reduction", "planned_config", "planned_simulated_speedup_ideal",
            "planned_simulated_speedup_calibrated", "planned_simulated_comm_reduction",
            "misses"}
    assert len(rows) == 7 and all(keys <= set(row) for row in rows)
    assert rows[0]["paper_comm_reduction"] == 90.0  # percent, not a fraction
    for row in rows:  # a row says why exactly when it misses a goal
        off = abs(row["simulated_speedup_calibrated"] / row["paper_speedup"] - 1) > 0.25 or \
            abs(row["simulated_comm_reduction"] - row["paper_comm_reduction"]) > 5
        assert bool(row["misses"]) == off, row
    md = (tmp_path / "t.md").read_text()
    assert "calibrated" in md and "rms log residual" in md and (tmp_path / "t.png").exists()
    bad = subprocess.run([sys.executable, "-m", "harness.cli", "reproduce", "table1",
                          "--profiles", str(PROFILES), "--json", str(tmp_path / "no/x.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--json" in bad.stderr


def test_a_cluster_outside_the_papers_is_refused() -> None:
    from core.errors import UserInputError

    odd = Cluster((Level(4, 7e9),))
    with pytest.raises(UserInputError, match="preset cluster"):
        MODEL.seconds(Topology(odd, [0, 1, 2, 3]), (0, 1), MB)


def test_gpt_cpu_profiles_use_the_full_scales_vocabulary_and_record_the_tie() -> None:
    """The default Markov data has 10,000 tokens and the GPT models take their vocabulary
    from the data: the profiled minibatch must carry the scale's own (GPT-2's 50,257), and
    GPT-2's embedding and head, one matrix, are recorded as a tie of that many bytes."""
    import torch

    from harness.sim.profile_source import full_shapes, tie_extra
    from workloads.registry import get

    for name in ("gpt", "gpt-llama"):
        cfg = get(name).spec("full").model
        data = full_shapes(name, 2)
        assert data.meta["vocab_size"] == cfg["vocab"] and len(data) == 2
        x = data.take(torch.arange(2))["x"]
        assert x.shape == (2, cfg["seq"]) and int(x.max()) < cfg["vocab"]
    gpt2 = get("gpt").build("tiny", {})
    width, vocab = get("gpt").spec("tiny").model["width"], get("gpt").spec("tiny").model["vocab"]
    ids = [f"layer{i}" for i in range(len(gpt2.layers))]
    assert tie_extra(gpt2, ids) == {"ties": [{"layers": ["layer0", ids[-1]],
                                              "bytes": 4.0 * width * vocab}]}
    assert tie_extra(get("gpt-llama").build("tiny", {}), ids) == {}


def test_our_plan_is_made_for_the_device_simulated() -> None:
    # uneven layers, heavy weights, light activations: on a slow device the all-reduce
    # (6 ms) is small beside the compute and data parallelism beats the uneven split;
    # 10,000x faster the all-reduce dominates and the pipeline wins. A row simulated at
    # compute_factor 10,000 is planned at that speed.
    from harness.sim import reproduce as rp
    from pipedream_impl.planner.plan import plan_profile

    prof = Profile((Node("n0", "Linear", 1000.0, 2000.0, (0.1 * MB,), 50 * MB),
                    Node("n1", "Linear", 100.0, 200.0, (0.1 * MB,), 50 * MB)),
                   (("n0", "n1"),), batch_size=8)
    cl = parse_cluster("A:1x2")
    assert plan_profile(prof, cl).config == "2"
    assert plan_profile(prof.faster(1e4), cl).config == "1-1"
    row = rp.simulate_config(prof, "A:1x2", 1e4, None, 16, MODEL)
    assert row["config"] == "1-1"
    assert row["planned_time_per_minibatch_s"] == pytest.approx(
        plan_profile(prof.faster(1e4), cl).predicted["time_per_minibatch_s"])


@needs_profiles
def test_the_planner_sees_the_calibrated_all_reduce_the_simulation_charges() -> None:
    # one level: the planner's ring at the fitted rate is the simulation's flat ring, so
    # its data-parallel time (overlapped) is the calibrated simulation's, and a plan of
    # data parallelism is predicted as simulated
    from harness.sim.simulator import SimOptions, layout_for, simulate_system
    from pipedream_impl.planner.antichain import build_states
    from pipedream_impl.planner.sync_cost import data_parallel_time

    prof = load_profile(PROFILES / "vgg16" / "graph.txt")
    for spec in ("A:1x4", "B:1x8"):
        cl = parse_cluster(spec)
        seen = MODEL.planner_cluster(cl)
        assert [lv.sync_bandwidth for lv in seen.levels] == \
            [MODEL.rate(cl, i) for i in range(len(cl.levels))]
        assert [lv.bandwidth for lv in seen.levels] == [lv.bandwidth for lv in cl.levels]
        dp = simulate_system(prof, cl, "ddp", layout_for(prof, cl, "ddp"),
                             SimOptions(minibatches=64, allreduce_model=MODEL))
        planned = data_parallel_time(build_states(prof.graph()), seen, "pipebench")
        assert planned == pytest.approx(dp.time_per_minibatch_s, rel=1e-6)
