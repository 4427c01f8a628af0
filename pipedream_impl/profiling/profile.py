"""``Profile``: per-layer measurements of one model at one batch size on one device.

The JSON form is the project's hand-off between ``pipebench profile`` and ``pipebench plan``::

    {"workload": "vgg16", "scale": "tiny", "batch_size": 32, "device": "cpu",
     "hardware": "...", "source": "measured",
     "layers": [{"id": "layer0", "desc": "Conv2d(...)", "forward_ms": 0.8,
                 "backward_ms": 1.3, "activation_bytes": [131072.0],
                 "parameter_bytes": 448.0}, ...],
     "edges": [["layer0", "layer1"], ...]}

``load_profile`` also reads PipeDream's ``graph.txt`` (see graph.py) by path.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.errors import GraphFormatError
from pipedream_impl.profiling.graph import Graph, Node, read_graph

__all__ = ["Profile", "infer_batch_size", "load_profile", "save_profile"]


@dataclass(frozen=True)
class Profile:
    layers: tuple[Node, ...]
    edges: tuple[tuple[str, str], ...]
    workload: str = ""
    scale: str = ""
    batch_size: int = 0
    device: str = ""
    hardware: str = ""
    source: str = "measured"  # or "graph.txt: <path>"
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = [n.node_id for n in self.layers]
        if len(set(ids)) != len(ids):
            raise GraphFormatError("duplicate layer ids in profile")
        if not ids:
            raise GraphFormatError("a profile needs at least one layer")

    def graph(self) -> Graph:
        g = Graph()
        for n in self.layers:
            g.add_node(n)
        for a, b in self.edges:
            g.add_edge(a, b)
        return g

    @staticmethod
    def from_graph(g: Graph, **meta: object) -> Profile:
        edges = tuple((a, b) for b in g.nodes for a in g.in_edges.get(b, []))
        return Profile(tuple(g.nodes.values()), edges, **meta)  # type: ignore[arg-type]

    def to_json(self) -> str:
        d = {k: v for k, v in asdict(self).items() if k not in ("layers", "edges")}
        d["layers"] = [{"id": n.node_id, "desc": n.desc, "forward_ms": n.forward_ms,
                        "backward_ms": n.backward_ms, "activation_bytes": list(n.activations),
                        "parameter_bytes": n.parameter_bytes} for n in self.layers]
        d["edges"] = [list(e) for e in self.edges]
        return json.dumps(d, indent=1)

    @staticmethod
    def from_json(text: str) -> Profile:
        d = json.loads(text)
        try:
            layers = tuple(Node(x["id"], x.get("desc", ""), float(x["forward_ms"]),
                                float(x["backward_ms"]),
                                tuple(float(a) for a in x["activation_bytes"]),
                                float(x["parameter_bytes"])) for x in d["layers"])
            edges = tuple((a, b) for a, b in d.get("edges", []))
        except (KeyError, TypeError, ValueError) as e:
            raise GraphFormatError(f"profile JSON is missing or has a bad field: {e}") from e
        meta = {k: d[k] for k in ("workload", "scale", "batch_size", "device", "hardware",
                                  "source", "extra") if k in d}
        return Profile(layers, edges, **meta)


def infer_batch_size(profile: Profile) -> int:
    """The minibatch size of an image profile from its input node (fp32, 3 x 224^2 or 299^2
    pixels, as in the shared PipeDream profiles); 0 when it cannot be told."""
    for n in profile.layers:
        if n.desc.startswith("Input"):
            for side in (224, 299, 227, 32):
                b = n.activation_bytes / (4 * 3 * side * side)
                if b >= 1 and abs(b - round(b)) < 1e-9:
                    return int(round(b))
    return 0


def load_profile(path: str | Path) -> Profile:
    """A project JSON profile, or an original PipeDream graph.txt."""
    p = Path(path)
    if not p.exists():
        raise GraphFormatError(f"profile {path} does not exist")
    text = p.read_text()
    if text.lstrip().startswith("{"):
        return Profile.from_json(text)
    return Profile.from_graph(read_graph(p), source=f"graph.txt: {p}", workload=p.parent.name)


def save_profile(profile: Profile, path: str | Path) -> None:
    """JSON, or graph.txt when the file name ends in .txt."""
    p = Path(path)
    if p.suffix == ".txt":
        profile.graph().write(p)
    else:
        p.write_text(profile.to_json())
