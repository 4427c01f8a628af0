"""``Profile``: per-layer measurements of one model at one batch size on one device.

The JSON form is the project's hand-off between ``pipebench profile`` and ``pipebench plan``::

    {"workload": "vgg16", "scale": "tiny", "batch_size": 32, "device": "cpu",
     "hardware": "...", "source": "measured",
     "layers": [{"id": "layer0", "desc": "Conv2d(...)", "forward_ms": 0.8,
                 "backward_ms": 1.3, "activation_bytes": [131072.0],
                 "parameter_bytes": 448.0}, ...],
     "edges": [["layer0", "layer1"], ...]}

``load_profile`` also reads PipeDream's ``graph.txt`` (see graph.py) by path. Both readers
check what they read and name the key or line that is wrong (``GraphFormatError``): JSON
that parses, the keys above with numbers where numbers belong, edges between known layers
and no cycle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from core.errors import GraphFormatError, read_text
from pipedream_impl.profiling.graph import Graph, Node, parse_graph

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
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise GraphFormatError(f"layer ids must be unique; {', '.join(twice[:5])} appear "
                                   "more than once")
        if not ids:
            raise GraphFormatError("a profile needs at least one layer")

    def graph(self) -> Graph:
        g = Graph()
        for n in self.layers:
            g.add_node(n)
        for a, b in self.edges:
            g.add_edge(a, b)
        return g

    def faster(self, factor: float) -> Profile:
        """The same profile on a device ``factor`` times as fast: every forward and
        backward time divided by it, bytes unchanged (what the simulator's
        ``compute_factor`` does, for the planner, which reads times only from profiles)."""
        if factor == 1.0:
            return self
        return replace(self, layers=tuple(
            replace(n, forward_ms=n.forward_ms / factor, backward_ms=n.backward_ms / factor)
            for n in self.layers))

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
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise GraphFormatError(f"not valid JSON (line {e.lineno}, column {e.colno}: "
                                   f"{e.msg}); write it with `pipebench profile -o FILE`") \
                from None
        if not isinstance(d, dict):
            raise GraphFormatError(f"expected a JSON object with \"layers\" (as `pipebench "
                                   f"profile` writes), got a {type(d).__name__}")
        if "stages" in d and "layers" not in d:
            raise GraphFormatError("this is a plan (`pipebench plan -o`), not a profile; give "
                                   "the profile JSON or graph.txt the plan was made from")
        if not isinstance(d.get("layers"), list) or not d["layers"]:
            raise GraphFormatError(f"needs \"layers\": a non-empty list of {{{_LAYER_KEYS}}} "
                                   f"(found keys: {', '.join(map(str, d)) or 'none'})")
        layers = tuple(_layer(i, x) for i, x in enumerate(d["layers"]))
        edges = d.get("edges", [])
        if not isinstance(edges, list) or not all(
                isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e)
                for e in edges):
            raise GraphFormatError("\"edges\" must be a list of [from_id, to_id] pairs of "
                                   "layer ids")
        meta = {k: d[k] for k in ("workload", "scale", "batch_size", "device", "hardware",
                                  "source", "extra") if k in d}
        b = meta.get("batch_size", 0)
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise GraphFormatError(f"\"batch_size\" must be a whole number, 0 or more (got "
                                   f"{b!r})")
        prof = Profile(layers, tuple((a, b) for a, b in edges), **meta)
        prof.graph().check_acyclic()  # and edges between known layers
        return prof


_LAYER_KEYS = "id, forward_ms, backward_ms, activation_bytes, parameter_bytes"


def _layer(i: int, x: object) -> Node:
    """One entry of a profile's ``layers``, read with the key that is wrong named."""
    if not isinstance(x, dict):
        raise GraphFormatError(f"layers[{i}] must be an object with {_LAYER_KEYS}")
    where = f"layers[{i}]" + (f" ({x['id']})" if isinstance(x.get("id"), str) else "")
    for key in _LAYER_KEYS.split(", "):
        if key not in x:
            raise GraphFormatError(f"{where} has no \"{key}\"; each layer needs "
                                   f"{_LAYER_KEYS}")
    if not isinstance(x["id"], str) or not x["id"]:
        raise GraphFormatError(f"{where}: \"id\" must be a non-empty string")

    def number(key: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GraphFormatError(f"{where}: \"{key}\" must be a number (got {value!r})")
        return float(value)

    acts = x["activation_bytes"]
    acts = acts if isinstance(acts, list) else [acts]
    node = (x["id"], str(x.get("desc", "")), number("forward_ms", x["forward_ms"]),
            number("backward_ms", x["backward_ms"]),
            tuple(number("activation_bytes", a) for a in acts),
            number("parameter_bytes", x["parameter_bytes"]))
    try:
        return Node(*node)
    except GraphFormatError as e:
        raise GraphFormatError(f"{where}: {e}") from None


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
    text = read_text(p, "profile", "give a `pipebench profile` JSON or a PipeDream graph.txt")
    if text.lstrip().startswith(("{", "[")) or (p.suffix == ".json" and text.strip()):
        try:
            return Profile.from_json(text)
        except GraphFormatError as e:
            raise GraphFormatError(f"profile {path}: {e}") from None
    try:
        graph = parse_graph(text)
    except GraphFormatError as e:
        raise GraphFormatError(f"profile {path}: {e}") from None
    return Profile.from_graph(graph, source=f"graph.txt: {p}", workload=p.parent.name)


def save_profile(profile: Profile, path: str | Path) -> None:
    """JSON, or graph.txt when the file name ends in .txt."""
    p = Path(path)
    if p.suffix == ".txt":
        profile.graph().write(p)
    else:
        p.write_text(profile.to_json())
