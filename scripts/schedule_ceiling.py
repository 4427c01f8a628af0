"""How fast each pipeline schedule could run here with free communication: the ceiling.

Why: issue 24 asks PipeDream (1F1B, no flush) to beat every flush pipeline by 1.10x at equal
microbatch size, 2 workers. A flush pipeline idles in its fill and drain; PipeDream does
not, but it pays per microbatch what a flush pays once per minibatch: an optimizer step
after every backward, and (on every stage but the last) a forward over a stashed copy of
the weights. Which side wins, and by how much, is a property of the actions' costs and the
schedule, before any transport or process enters. This script measures those costs and
replays them:

- the actions' costs: every stage of each system run in this one process on the runtime's
  own handlers (``pipedream_impl.runtime.local``; ``harness.sim.validation.measured_actions``:
  real data, stage modules, weight stashing, optimizer), each system at the same microbatch
  (the workload's batch size b): PipeDream K minibatches of b, a flush K/m minibatches of
  m microbatches of b. The systems are measured in turn, their order reversed every round,
  and each action's median over the rounds is kept;
- the ceiling: the simulator (``harness.sim.simulator``) runs each system's schedule on
  those costs with no time for any transfer, for the K microbatches of a short epoch (as
  ``pipebench bench`` runs them: fill and drain in each) and for 10 K (nearly steady);
- what PipeDream pays for having no flush, by replaying its schedule again with its
  per-microbatch costs swapped for the flush's: the update spread over m microbatches as
  a flush spreads it, the forward and backward at the flush's (on the live weights).

The split is the 2-stage split the suites and ``pipebench bench`` run (layers balanced on
the committed profile in ``suites/profiles``). What the ceiling leaves out (transfers, the
other process, the scheduler) is what separates it from a measured run
(``results/bench-peers-*.md``).

Usage: ``.venv/bin/python scripts/schedule_ceiling.py [--workload vgg16] [--rounds 6]
[--steps 24] [-o results/schedule-ceiling-vgg16.md]``. Nothing else may run on the machine
meanwhile.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core.markdown import markdown_table  # noqa: E402
from harness import systems  # noqa: E402
from harness.reporting.tracking import git_sha  # noqa: E402
from harness.sim.costs import MachineModel  # noqa: E402
from harness.sim.simulator import SimLayout, SimOptions, simulate_system  # noqa: E402
from harness.sim.validation import measured_actions  # noqa: E402
from pipedream_impl.planner.cluster import Cluster, Level  # noqa: E402
from pipedream_impl.planner.splits import balanced_bounds  # noqa: E402
from pipedream_impl.profiling.profile import load_profile  # noqa: E402
from pipedream_impl.schedule import registry as schedules  # noqa: E402
from workloads import registry  # noqa: E402

PIPEDREAM = systems.PAPER["planned"]
FLUSHES = ("gpipe", "pipedream-flush")  # ours: the same handlers, another schedule
FREE = 1e15  # bytes/s: the ceiling's links cost nothing
KINDS = ("F", "B", "U")


def _measure(name: str, bounds: tuple, b: int, steps: int, rounds: int) \
        -> tuple[dict[str, dict[int, dict[str, float]]], dict[str, int]]:
    """Each system's median seconds per action of each stage over the rounds, and its
    microbatches per minibatch."""
    got: dict[str, list] = {s: [] for s in (PIPEDREAM, *FLUSHES)}
    ms = {s: schedules.microbatches(systems.get(s).schedule, 2)
          if systems.get(s).microbatched else 1 for s in got}
    for r in range(rounds):
        order = list(got) if r % 2 == 0 else list(got)[::-1]
        for s in order:
            sys_, m = systems.get(s), ms[s]
            print(f"schedule_ceiling: {name} round {r + 1}/{rounds} {s}", file=sys.stderr,
                  flush=True)
            actions, _ = measured_actions(name, (1, 1), bounds, m * b, steps // m,
                                          sys_.schedule, sys_.in_flight, m)
            got[s].append(actions)
    med = {s: {st: {k: statistics.median(a[st][k] for a in runs) for k in runs[0][st]}
               for st in runs[0]} for s, runs in got.items()}
    return med, ms


def _ceiling(prof, cluster: Cluster, layout: SimLayout, system: str,  # noqa: ANN001
             actions: dict, minibatches: int, m: int, b: int) -> tuple[float, float]:
    """Samples/s of ``minibatches`` of ``system`` on ``actions`` with free links, and the
    mean share of the ranks' time not spent in F, B or U (the bubble)."""
    options = SimOptions(minibatches=minibatches, microbatches=m, latency_s=0.0,
                         machine=MachineModel(action_s=actions))
    sim = simulate_system(prof, cluster, system, layout, options)
    busy = [sum(e - s for s, e, a in row if a.kind in KINDS) for row in sim.timeline]
    return minibatches * m * b / sim.total_s, 1 - statistics.mean(busy) / sim.total_s


def _per_unit(costs: dict[str, float], kind: str, m: int) -> float:
    """Seconds of ``kind`` per microbatch (an update serves the m of its minibatch)."""
    return costs[kind] / (m if kind == "U" else 1)


def _swapped(pd: dict, flush: dict, m: int, kinds: tuple[str, ...]) -> dict:
    """PipeDream's costs with ``kinds`` taken from the flush's (its update spread over the
    m microbatches it serves)."""
    return {st: {k: (_per_unit(flush[st], k, m) if k in kinds else v)
                 for k, v in costs.items()} for st, costs in pd.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="vgg16")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=24, help="microbatches of an epoch")
    ap.add_argument("--split", type=int, default=None,
                    help="stage 1's first layer (default: balanced on the suites' profile)")
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    command = shlex.join([".venv/bin/python", "scripts/schedule_ceiling.py", *sys.argv[1:]])
    out = Path(args.output or f"results/schedule-ceiling-{args.workload}.md")
    wl = registry.get(args.workload)
    b = wl.spec("tiny").batch_size
    git = git_sha(untracked=True)
    prof = load_profile(ROOT / "suites" / "profiles" / f"{wl.name}-tiny-b{b}-cpu.json")
    cluster = Cluster((Level(2, FREE),))
    bounds = balanced_bounds([n.forward_ms + n.backward_ms for n in prof.layers], (1, 1))
    how = "balanced on the suites' committed profile of this workload"
    if args.split is not None:
        bounds, how = ((0, args.split), (args.split, bounds[-1][1])), "given"
    nodes = list(prof.graph().nodes)
    layout = SimLayout([tuple(nodes[a:z]) for a, z in bounds], (1, 1))
    med, ms = _measure(args.workload, bounds, b, args.steps, args.rounds)
    lines = _report(args, command, git, (bounds, how), b, prof, cluster, layout, med, ms)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}", file=sys.stderr)


def _report(args, command: str, git: str, split: tuple, b: int, prof,  # noqa: ANN001
            cluster: Cluster, layout: SimLayout, med: dict, ms: dict) -> list[str]:
    k, (bounds, how) = args.steps, split
    rows, rates = [], {}
    for s, actions in med.items():
        m = ms[s]
        short, bubble = _ceiling(prof, cluster, layout, s, actions, k // m, m, b)
        long, _ = _ceiling(prof, cluster, layout, s, actions, 10 * k // m, m, b)
        rates[s] = (short, long)
        costs = " / ".join(" ".join(f"{kind} {1e3 * _per_unit(actions[st], kind, m):.2f}"
                                    for kind in KINDS) for st in sorted(actions))
        rows.append((s, m, costs, f"{short:.0f}", f"{long:.0f}", f"{100 * bubble:.0f}%"))
    best = max(FLUSHES, key=lambda s: rates[s][0])
    pd, flush, m = med[PIPEDREAM], med[best], ms[best]
    what = [("its update spread over m microbatches (as the flush's)",
             _swapped(pd, flush, m, ("U",))),
            ("its forward and backward at the flush's", _swapped(pd, flush, m, ("F", "B"))),
            ("both", _swapped(pd, flush, m, KINDS))]

    def rate(actions: dict, n: int) -> float:
        return _ceiling(prof, cluster, layout, PIPEDREAM, actions, n, 1, b)[0]

    replayed = [("as measured", rates[PIPEDREAM])]  # simulated above
    replayed += [(label, (rate(actions, k), rate(actions, 10 * k))) for label, actions in what]
    ratio_rows = [(label, f"{short / rates[best][0]:.3f}", f"{long / rates[best][1]:.3f}")
                  for label, (short, long) in replayed]
    return [f"# The schedules' ceiling here: {args.workload} (tiny), 2 stages, free links", "",
            f"Generated by `{command}` at git {git}; 1 torch thread; microbatch {b} for "
            f"every system; split {list(map(list, bounds))} ({how}); {args.rounds} rounds, "
            "the systems in turn, order reversed every other round; each action's median "
            "over the rounds. How and why: the script's docstring.", "",
            "## Each system on its own measured actions, no transfer time", "",
            f"Action costs in ms (stage 0 / stage 1; U per microbatch it serves). "
            f"Samples/s of an epoch of {k} microbatches (fill and drain in it, as "
            f"`pipebench bench` runs them) and of {10 * k}; bubble: the ranks' mean share "
            "of the short epoch outside F, B and U.", "",
            *markdown_table(("system", "m", "F B U per microbatch, ms", f"samples/s ({k})",
                             f"samples/s ({10 * k})", "bubble"), rows), "",
            f"## PipeDream against the fastest flush here ({best})", "",
            "PipeDream's ceiling over the flush's, as measured and with its "
            "per-microbatch costs replaced by the flush's (what having no flush costs it "
            "on this workload):", "",
            *markdown_table(("PipeDream's actions", f"ratio ({k})", f"ratio ({10 * k})"),
                            ratio_rows)]


if __name__ == "__main__":
    main()
