"""pipedream_impl/profiling/graph.py and profile.py: graph.txt and JSON round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.errors import GraphFormatError
from pipedream_impl.profiling.graph import Node, parse_graph
from pipedream_impl.profiling.profile import Profile, infer_batch_size, load_profile, save_profile

SHARED = Path(__file__).resolve().parents[4] / "shared" / "pipedream-profiles"
TEXT = (
    "node1 -- Input -- forward_compute_time=0.000, backward_compute_time=0.000, "
    "activation_size=77070336.0, parameter_size=0.000\n"
    "node2 -- LSTM(2048, 1024) -- forward_compute_time=3.190, backward_compute_time=5.348, "
    "activation_size=[6291456.0; 131072.0; 131072.0], parameter_size=50364416.000\n"
    "node3 -- Add -- forward_compute_time=0.000, backward_compute_time=0.000, "
    "activation_size=6291456.0, parameter_size=0.000 -- stage_id=1\n"
    "\tnode1 -- node2\n\tnode2 -- node3\n\tnode1 -- node3\n"
)


def test_parse_node_lists_and_stage_suffix() -> None:
    g = parse_graph(TEXT)
    assert list(g.nodes) == ["node1", "node2", "node3"]
    lstm = g.nodes["node2"]
    assert lstm.activations == (6291456.0, 131072.0, 131072.0)
    assert lstm.activation_bytes == 6291456.0 + 2 * 131072.0
    assert (lstm.forward_ms, lstm.backward_ms, lstm.parameter_bytes) == (3.19, 5.348, 50364416.0)
    assert g.edges["node1"] == ["node2", "node3"] and g.in_edges["node3"] == ["node2", "node1"]


def test_graph_txt_round_trip(tmp_path: Path) -> None:
    g = parse_graph(TEXT)
    again = parse_graph(g.to_text())
    assert again.nodes == g.nodes and again.edges == g.edges and again.in_edges == g.in_edges
    prof = Profile.from_graph(g, workload="x", batch_size=128)
    save_profile(prof, tmp_path / "p.json")
    loaded = load_profile(tmp_path / "p.json")
    assert loaded.layers == prof.layers and loaded.edges == prof.edges
    assert loaded.batch_size == 128
    save_profile(prof, tmp_path / "graph.txt")
    assert load_profile(tmp_path / "graph.txt").layers == prof.layers


@pytest.mark.parametrize("model", sorted(p.name for p in SHARED.iterdir() if p.is_dir())
                         if SHARED.exists() else [])
def test_every_shared_profile_reads_and_round_trips(model: str) -> None:
    g = load_profile(SHARED / model / "graph.txt").graph()
    again = parse_graph(g.to_text())
    assert again.nodes == g.nodes and again.edges == g.edges


def test_batch_size_inferred_from_the_input_node() -> None:
    assert infer_batch_size(Profile.from_graph(parse_graph(TEXT))) == 128
    n = Node("a", "Conv", 1, 1, (4.0,), 0)
    assert infer_batch_size(Profile((n,), ())) == 0


def test_bad_lines_name_the_line() -> None:
    with pytest.raises(GraphFormatError, match="line 1"):
        parse_graph("node1 -- Input -- nonsense\n")
    with pytest.raises(GraphFormatError, match="line 2.*unknown node node9"):
        parse_graph(TEXT.splitlines()[0] + "\n\tnode1 -- node9\n")


def test_a_cycle_is_named_node_by_node() -> None:
    with pytest.raises(GraphFormatError, match=r"cycle: node2 -> node3 -> node2; .*remove the "
                                               r"edge node3 -- node2"):
        parse_graph(TEXT + "\tnode3 -- node2\n")


def test_repeated_nodes_and_edges_and_bad_numbers_name_the_line() -> None:
    first = TEXT.splitlines()[0]
    with pytest.raises(GraphFormatError, match="line 4: node node1 is declared twice"):
        parse_graph(TEXT.replace("\tnode1 -- node2", first + "\n\tnode1 -- node2"))
    with pytest.raises(GraphFormatError, match="line 7: edge node1 -- node2 appears twice"):
        parse_graph(TEXT + "\tnode1 -- node2\n")
    with pytest.raises(GraphFormatError, match="line 2: backward_compute_time='x' is not a"):
        parse_graph(TEXT.replace("backward_compute_time=5.348", "backward_compute_time=x"))
    with pytest.raises(GraphFormatError, match="line 2: node node2: forward time inf"):
        parse_graph(TEXT.replace("forward_compute_time=3.190", "forward_compute_time=inf"))


def test_profile_json_errors_name_the_key(tmp_path: Path) -> None:
    prof = Profile.from_graph(parse_graph(TEXT), batch_size=128)
    d = json.loads(prof.to_json())
    del d["layers"][1]["parameter_bytes"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(GraphFormatError, match=r'p.json: layers\[1\] \(node2\) has no '
                                               r'"parameter_bytes"'):
        load_profile(path)
    d = json.loads(prof.to_json())
    d["edges"].append(["node3", "node1"])
    path.write_text(json.dumps(d))
    with pytest.raises(GraphFormatError, match="cycle: node1 -> node2 -> node3 -> node1"):
        load_profile(path)
