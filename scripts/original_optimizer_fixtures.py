"""Record the original PipeDream optimizer's own answers as a test fixture.

Why: ``pipedream-2019`` (pipedream_impl/planner) claims to make the decisions of the
original optimizer (msr-fiddle/pipedream, optimizer/optimizer_graph_hierarchical.py with
graph/graph.py). This script runs that ORIGINAL code, unchanged, on the authors' profiles
(../shared/pipedream-profiles) for the project's clusters and writes what it answers
(bottleneck time, data-parallel time, stages and replicas) to
tests/pipedream_impl/planner/fixtures/original_optimizer.json, which
tests/pipedream_impl/planner/test_original_fixtures.py compares the planner with.

Usage (the original is not part of this repository; fetch it yourself)::

    python scripts/original_optimizer_fixtures.py ORIGINAL [--profiles DIR] [-o FILE]
        [--only PROFILE ...] [--seeds 0 1 2] [--jobs 2]

ORIGINAL is a checkout of msr-fiddle/pipedream (a directory holding optimizer/ and graph/)
or its bare git directory (the two folders are then extracted from HEAD into a temporary
directory). Nothing of the original is copied into this repository.

How the original is run (no line of its source is changed):
- ``graphviz`` (imported by graph.py, used only to draw) is replaced by an empty module
  when it is not installed;
- ``compute_partitioning`` reads its options as module globals (set by the original's
  ``__main__`` block); we set them as its command line would with
  ``--activation_compression_ratio 1`` (transfers charged, as pipedream-2019 does),
  no memory constraint, no ``--use_fewer_machines``, and ``--straight_pipeline`` for the
  straight rows;
- ``compute_partitioning`` is wrapped so that its ``all_predecessor_ids`` lists answer
  ``k in list`` from a set (same elements, same iteration order): the original tests list
  membership in its innermost loop, which makes GNMT-16 on two levels take hours;
- ``main`` is called with verbose off and its printed configuration parsed; states are
  taken from the antichain DAG's topological sort (recorded by wrapping the method).

Each configuration runs in its own process with ``PYTHONHASHSEED`` fixed: on branching
graphs the original's state order depends on the hash seed (graph.py lists a set), so each
configuration is run with every seed given and all answers are recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["CLUSTERS", "PROFILES", "main", "run_original"]

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLUSTERS = ("A:1x4", "A:2x4", "A:4x4", "B:1x8", "B:2x8", "C:4x1", "16")
# Profiles whose antichain DAG the original handles (Inception-v3 and the NASNets have
# over 200,000 antichains: the original's N x N x M tables cannot be allocated).
PROFILES = ("alexnet", "vgg16", "gnmt", "gnmt_large", "resnet18", "squeezenet1_0",
            "resnet50", "resnext50", "resnet101", "resnext101", "densenet121")
_STAGE = re.compile(r"^\((\d+), (\d+)\) \S+ (\d+)$")


class _FastList(list):
    """A list whose ``in`` is a set lookup: same elements, same order when iterated."""

    def __init__(self, items: list) -> None:
        super().__init__(items)
        self._set = frozenset(items)

    def __contains__(self, x: object) -> bool:
        return x in self._set


def _load_original(original: Path) -> tuple[types.ModuleType, types.ModuleType]:
    if "graphviz" not in sys.modules:
        try:
            import graphviz  # noqa: F401
        except ImportError:
            sys.modules["graphviz"] = types.ModuleType("graphviz")
    sys.path[:0] = [str(original / "optimizer"), str(original)]
    sys.setrecursionlimit(100000)
    import graph  # the original's graph package
    import optimizer_graph_hierarchical as opt
    return opt, graph


def run_original(original: Path, profile: Path, levels: list[tuple[int, float]],
                 straight: bool) -> dict:
    """One run of the original's ``main`` in this process."""
    opt, graph = _load_original(original)
    opt.straight_pipeline = straight
    opt.use_memory_constraint = False
    opt.memory_size = 16e9
    opt.use_fewer_machines = False
    opt.activation_compression_ratio = 1.0
    inner_cp = opt.compute_partitioning

    def fast_cp(ct, acts, params, outs, preds, *args, **kw):  # noqa: ANN001, ANN002, ANN003
        return inner_cp(ct, acts, params, outs, [_FastList(p) for p in preds], *args, **kw)

    opt.compute_partitioning = fast_cp
    recorded: list = []
    inner_sort = graph.Graph.topological_sort

    def sort(self):  # noqa: ANN001, ANN202
        out = inner_sort(self)
        if out and hasattr(out[0], "antichain"):
            recorded.append(out)
        return out

    graph.Graph.topological_sort = sort
    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        pipeline, dp = opt.main([w for w, _ in levels], str(profile), [b for _, b in levels],
                                16e9, straight, False, False, 1.0, None,
                                print_configuration=True, verbose=False)
    seconds = time.perf_counter() - t0
    states = recorded[-1]
    per_level: dict[int, list[tuple[int, int, int]]] = {}
    level = None
    for line in buf.getvalue().splitlines():
        if line.startswith("Level "):
            level = int(line.split()[1])
        m = _STAGE.match(line.strip())
        if m and level is not None:
            per_level.setdefault(level, []).append(tuple(int(x) for x in m.groups()))
    # Flatten: every innermost stage with its replicas per level (innermost first).
    top = len(levels)
    flat = [(a, b, [r]) for a, b, r in per_level[top]]
    for lv in range(top - 1, 0, -1):
        nxt = []
        for a, b, reps in flat:
            inner = [(x, y, r) for x, y, r in per_level[lv] if a <= x and y <= b]
            nxt.extend((x, y, [r, *reps]) for x, y, r in inner)
        flat = nxt
    stages = [{"cut": sorted(states[b - 1].antichain), "replicas": reps}
              for _, b, reps in flat]
    return {"bottleneck_s": pipeline, "data_parallel_s": dp, "states": len(states),
            "stages": stages, "config": "-".join(str(_prod(s["replicas"])) for s in stages),
            "seconds": round(seconds, 2)}


def _prod(xs: list[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _levels(cluster: str) -> list[tuple[int, float]]:
    from pipedream_impl.planner.cluster import parse_cluster
    return [(lv.workers, lv.bandwidth) for lv in parse_cluster(cluster).levels]


def _one(original: Path, profiles: Path, name: str, cluster: str, straight: bool,
         seed: int) -> dict:
    cmd = [sys.executable, __file__, str(original), "--worker",
           json.dumps([str(profiles / name / "graph.txt"), _levels(cluster), straight])]
    env = dict(os.environ, PYTHONHASHSEED=str(seed))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{name} {cluster} seed {seed}: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _extract(original: Path) -> Path:
    if (original / "optimizer").is_dir():
        return original
    tmp = Path(tempfile.mkdtemp(prefix="pipedream-original-"))
    tar = subprocess.run(["git", "--git-dir", str(original), "archive", "HEAD", "optimizer",
                          "graph"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar, check=True)
    return tmp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("original", type=Path)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" /
                    "pipedream-profiles")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "tests" / "pipedream_impl" /
                    "planner" / "fixtures" / "original_optimizer.json")
    ap.add_argument("--only", nargs="*", default=list(PROFILES))
    ap.add_argument("--clusters", nargs="*", default=list(CLUSTERS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    if args.worker:
        profile, levels, straight = json.loads(args.worker)
        print(json.dumps(run_original(args.original, Path(profile),
                                      [tuple(x) for x in levels], straight)))
        return
    original = _extract(args.original)
    old = json.loads(args.output.read_text()) if args.output.exists() else {"cases": []}
    done = {(c["profile"], c["cluster"], c["straight"]): c for c in old["cases"]}
    todo = [(p, c, s) for p in args.only for c in args.clusters for s in (False, True)]

    def case(key: tuple[str, str, bool]) -> dict:
        name, cluster, straight = key
        runs = {str(seed): _one(original, args.profiles, name, cluster, straight, seed)
                for seed in args.seeds}
        first = runs[str(args.seeds[0])]
        print(f"{name} {cluster} {'straight' if straight else 'replicated'}: "
              f"{first['bottleneck_s']:.6g} s {first['config']} "
              f"({max(r['seconds'] for r in runs.values())} s)", file=sys.stderr, flush=True)
        return {"profile": name, "cluster": cluster, "straight": straight,
                "levels": _levels(cluster), "runs": runs}

    with ThreadPoolExecutor(args.jobs) as pool:
        for c in pool.map(case, todo):
            done[(c["profile"], c["cluster"], c["straight"])] = c
            args.output.parent.mkdir(parents=True, exist_ok=True)
            cases = sorted(done.values(), key=lambda c: (c["profile"], c["cluster"],
                                                          c["straight"]))
            args.output.write_text(json.dumps({"source": _SOURCE, "cases": cases},
                                              indent=1) + "\n")


_SOURCE = ("msr-fiddle/pipedream optimizer/optimizer_graph_hierarchical.py (main, "
           "activation_compression_ratio=1, no memory constraint, use_fewer_machines off) "
           "run by scripts/original_optimizer_fixtures.py under Python 3; runs: per "
           "PYTHONHASHSEED")

if __name__ == "__main__":
    main()
