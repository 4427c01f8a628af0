"""``pipebench bench``: the throughput benchmark, as a suite (``harness.experiments.suite``)
of repeated, interleaved cells, and the markdown report of a suite result.

Throughput cells follow one rule for every system: every pipeline runs the planner's
straight split of one local profile (the same layer ranges for pipedream, gpipe,
model-parallel and the peers). PipeDream and model parallelism process minibatches of
``b`` samples (the workload's batch size unless given); the flush pipelines (gpipe,
torch-gpipe, torch-1f1b, deepspeed-pipe) process minibatches of ``M x b`` split into M
microbatches of ``b``, so every pipeline moves units of the same size; data parallelism
and ``single`` use global minibatches of ``b``. Every system trains the same samples per
epoch: K flush minibatches (K = ``steps``, at most what the training set holds) or
K x M minibatches of ``b``; a repeat's throughput is the median over its epochs, warm-up
steps excluded, and its steady-state throughput the summed rate of windows of minibatch
completions (``harness.experiments.steady``: fill, drain and evaluation excluded); a
cell's is the median over repeats (``harness.reporting.results``), shown with the
interval of the repeats' geometric mean and the cell's minimum detectable change
(``mdcs``: of its steady throughput as ``pipebench regressions`` would judge it against
another result like this one). Time-to-target cells run seed r in repeat r, and each pair of
systems is tested for "reaches the target faster" over those seeds (``seed_claims``).

Targets (issue 24), reported, never asserted (``checks``): each of our flush pipelines
>= 0.95x every peer engine running the same schedule on the same split; pipedream >= 1.10x
the fastest flush pipeline at equal microbatch size; each judged on its ratio's interval
over the repeats, so that a rerun of one commit does not flip a verdict the noise cannot
decide (it is then "undecided"). The report also gives Horovod /
DDP and the harness's overhead (tracking on vs off) where the suite measured them.
"""

from __future__ import annotations

import math

from core.markdown import markdown_table
from harness import metrics, systems
from harness.experiments.suite import Cell, Suite
from harness.reporting import moderation, regressions, seeds, verdicts
from harness.reporting.results import cell_row, overhead_table
from pipedream_impl.runtime import SPAWN_LAUNCHER, STAGE_EXECUTOR
from pipedream_impl.schedule import registry as schedules

__all__ = ["COLUMNS", "adhoc_suite", "checks", "markdown", "mdcs", "seed_claims", "unit_sizes"]

COLUMNS = ("system", "status", "config", "microbatch", "samples/s (median)", "min-max",
           "spread", "steady samples/s [CI]", "MDC", "vs single", "time to target",
           "bytes/sample", "peak mem", "bubble")


def unit_sizes(microbatched: bool, m: int, b: int, k: int) -> tuple[int, int]:
    """A throughput cell's (minibatch size, minibatches per epoch), the module's rule: a
    flush pipeline K minibatches of ``m`` x ``b`` (``m`` microbatches of ``b``), any other
    system K x ``m`` minibatches of ``b``, so every system trains the same samples."""
    return (m * b, k) if microbatched else (b, k * m)


def adhoc_suite(workload: str, system_names: tuple[str, ...], workers: int, scale: str,
                epochs: int, steps: int, repeats: int, threads: int, device: str,
                batch_size: int | None, microbatches: int | None) -> Suite:
    """The suite ``bench`` runs when no ``--suite`` is given: one throughput group."""
    for s in system_names:
        systems.get(s)  # unknown names: a clear error before anything runs
    cells = tuple(Cell(workload, s, workers, scale, "throughput", epochs, steps, True,
                       batch_size, microbatches) for s in system_names)
    return Suite("adhoc", f"bench of {workload} ({scale}) on {workers} workers", repeats,
                 threads, device, cells, "command line")


SAME_SCHEDULE_GOAL = 0.95  # our engine against a peer's running the same schedule and split
PIPEDREAM_GOAL = 1.10  # PipeDream (no flush) against the fastest flush pipeline


def _goal(a: str, b: str, goal: float, rates: dict[str, float],
          values: dict[str, list[float]] | None) -> tuple[bool | None, str, bool]:
    """``a`` against ``goal`` times ``b``, (passed, how, on an interval): with two or more
    usable repeats a side, the ratio of their geometric means and its
    ``verdicts.INTERVAL`` interval (Welch, on the logs: ``seeds.faster``), met (True)
    where the whole interval is at or above the goal, not met (False) where it is below,
    undecided (None) where it holds the goal; else the medians' ratio against the goal."""
    f = seeds.faster(values[a], values[b]) if values and a in values and b in values \
        else None
    if f is None or math.isnan(f.ratio):
        x = rates[a] / rates[b]
        return x >= goal, f"{x:.2f}x", False
    ok = True if f.low >= goal else False if f.high < goal else None
    return ok, f"{f.ratio:.2f}x [{f.low:.2f}, {f.high:.2f}]", True


# which verdict of several a goal over all of them shows: the worst, NOT met first
_WORST_FIRST = {False: 0, None: 1, True: 2}


def mdcs(result: dict) -> tuple[dict[str, float], float, int]:
    """Each cell's MDC of its steady throughput (of the raw and drift-cancelled figures
    the one the rule would judge) as ``pipebench regressions`` would state it comparing
    another result like this one with it: at that comparison's level per metric, the
    cell's noise (its repeats' variance, taken for both results) moderated by a prior
    fitted on this result's cells alone (the same data twice is not twice the evidence;
    the cap on its degrees of freedom counts a pair's);
    that level and how many metrics the comparison judges."""
    changes, level, judged = regressions.compare_at_rate([result], result)
    steady = (metrics.STEADY_THROUGHPUT, metrics.STEADY_PER_REFERENCE)
    chosen = {c.cell: c.name for c in regressions.judged(changes) if c.name in steady}
    own = {(c["key"], name): verdicts.spread([c["metrics"][name]["values"]], [])
           for c in result["cells"] for name in steady
           if c["status"] == "ok" and name in c.get("metrics", {})}
    out = {}
    for name in steady:
        found = [(dev, df) for (_, n), (dev, df) in own.items() if n == name and df]
        prior = moderation.fit_spreads(found, 2 * max((df for _, df in found), default=0))
        for key in (k for k, n in chosen.items() if n == name):
            dev, df = own[key, name]
            var, pair_df = prior.moderate_pair(dev, df)
            out[key] = verdicts.mdc(math.sqrt(var), df + 1, df + 1, pair_df, level)
    return out, level, judged


def checks(rates: dict[str, float], values: dict[str, list[float]] | None = None
           ) -> list[tuple[str, bool | None, str, bool]]:
    """Issue 24's throughput goals on one group's median rates, (what, passed, how, on an
    interval): each of our pipelines against every peer engine that runs the same schedule
    on the same split (gpipe / torch-gpipe; pipedream-flush / torch-1f1b and
    deepspeed-pipe), and PipeDream against every flush pipeline at equal microbatch size
    (judged against each, the worst verdict shown: NOT met, then undecided, then met;
    among equals the fastest by median). With each system's repeats (``values``) a goal
    is judged on its ratio's interval (``_goal``: passed is None where the interval holds
    the goal). Same split and equal microbatches are the throughput cells' rule (module
    doc), not checked here."""
    kinds = {s: systems.get(s) for s in rates}
    out = []
    for ours, k in kinds.items():
        if k.executor != STAGE_EXECUTOR or not k.flushes or \
                schedules.get(k.schedule).from_file:  # a file's schedule: no fixed peer
            continue
        for peer, pk in kinds.items():
            if pk.executor != STAGE_EXECUTOR and pk.schedule == k.schedule:
                out.append((f"{ours} >= {SAME_SCHEDULE_GOAL}x {peer}",
                            *_goal(ours, peer, SAME_SCHEDULE_GOAL, rates, values)))
    planned = next((s for s, k in kinds.items() if k.replicated_stages), None)
    flush = {s: v for s, v in rates.items() if kinds[s].flushes}
    if planned and flush:
        judged = {f: _goal(planned, f, PIPEDREAM_GOAL, rates, values) for f in flush}
        worst = min(flush, key=lambda f: (_WORST_FIRST[judged[f][0]], -flush[f]))
        ok, how, interval = judged[worst]
        out.append((f"{planned} >= {PIPEDREAM_GOAL}x every flush pipeline", ok,
                    f"{how} against {worst}", interval))
    return out


VERDICT = {True: "met", False: "NOT met", None: "undecided"}


def _dp_ratio(rates: dict[str, float]) -> str | None:
    """Horovod / DDP: the data-parallel baselines on the same math."""
    dp = [s for s in rates if systems.get(s).kind == "data-parallel"]
    ddp = systems.PAPER["data-parallel"]  # in our own launcher's processes
    hvd = next((s for s in dp if systems.get(s).launcher != SPAWN_LAUNCHER), None)
    ddp = ddp if ddp in rates else None
    if hvd and ddp:
        return f"{hvd} / {ddp}: {rates[hvd] / rates[ddp]:.2f}x"
    return None


def seed_claims(cells: list[dict]) -> list[str]:
    """Time to target over seeds (a time-to-target cell's repeat r runs seed r), each pair
    of systems: the ratio of geometric means with its interval, and the one-sided test that
    the faster-looking one is faster (``seeds.faster``)."""
    times = {c["system"]: c["metrics"][metrics.TIME_TO_TARGET]["values"] for c in cells
             if metrics.TIME_TO_TARGET in c.get("metrics", {})}
    out = []
    names = sorted(times)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            a, b = first, second  # the swap below must not rebind the loop's names
            f = seeds.faster(times[a], times[b])
            if math.isnan(f.ratio):
                out.append(f"- {a} vs {b}: fewer than 2 seeds reached the target on a side")
                continue
            if f.ratio > 1:  # state it as the faster-looking one's claim
                a, b, f = b, a, seeds.faster(times[b], times[a])
            out.append(f"- {a} reaches the target in {f.ratio:.2f}x the time of {b} "
                       f"[{f.low:.2f}, {f.high:.2f}] over {len(times[a])} / {len(times[b])} "
                       f"seeds; {a} faster: p = {f.p:.3f}, "
                       + ("shown" if f.shown else "not shown")
                       + f" at {seeds.TTA_ALPHA:g} (one-sided)")
    return out


def markdown(result: dict, rendered_by: str = "") -> str:
    """The report of a suite result; ``rendered_by``: the command that makes it again from
    the stored result (named beside the one that ran it, where the result records it)."""
    env, suite = result["environment"], result["suite"]
    lines = [f"# Suite {suite['name']}: {suite['description']}", ""]
    ran = result.get("command")
    if ran or rendered_by:
        lines += [f"Generated by `{ran or rendered_by}`."
                  + (f" This report made again from its result by `{rendered_by}`."
                     if ran and rendered_by else ""), ""]
    lines += [f"{suite['repeats']} repeat(s), systems interleaved; {suite['threads']} torch "
              f"thread(s) per worker process; {env['hardware']}; git {env['git_sha']}; "
              f"torch {env['torch']}.", "",
              f"Median over repeats ({result['rule']['drop_extremes_from']} or more: fastest "
              "and slowest dropped), spread = "
              "(max - min) / median; `~` marks a cell whose spread exceeds "
              f"{100 * result['rule']['stability']:.0f}% (unstable).", ""]
    seen, level, judged = mdcs(result)
    lines += [f"MDC: the smallest change of the cell's steady throughput that `pipebench "
              f"regressions` would flag with {verdicts.POWER:.0%} probability against "
              f"another result like this one, whose {judged} judged metrics it tests at "
              f"{verdicts.SUITE_ALPHA:g} / {judged} = {level:.2g} each." if judged else
              "MDC: none (no cell has a noise estimate: one repeat).", ""]
    groups: dict[tuple, list[dict]] = {}
    for c in result["cells"]:
        groups.setdefault((c["workload"], c["scale"], c["workers"], c["mode"],
                           c["tracking"]), []).append(c)
    for (wl, scale, workers, mode, tracked), cells in groups.items():
        lines += [f"## {wl} ({scale}), {workers} workers, {mode}"
                  + ("" if tracked else ", tracking off"), ""]
        rates = {c["system"]: c["metrics"][metrics.THROUGHPUT]["median"]
                 for c in cells if metrics.THROUGHPUT in c.get("metrics", {})}
        single = next((v for s, v in rates.items()
                       if systems.get(s).kind == "one-process"), None)
        lines += markdown_table(COLUMNS, [cell_row(c, single, seen.get(c["key"], math.inf))
                                          for c in cells])
        values = {c["system"]: c["metrics"][metrics.THROUGHPUT]["values"]
                  for c in cells if metrics.THROUGHPUT in c.get("metrics", {})}
        goals = checks(rates, values) if mode == "throughput" else []
        notes = [f"- {what}: {VERDICT[ok]} ({how})" for what, ok, how, _ in goals]
        if any(interval for *_, interval in goals):
            notes[:0] = [f"Goals (issue 24): the ratio of the repeats' geometric means with "
                         f"its {verdicts.INTERVAL:.0%} interval (where a side has fewer "
                         "than two repeats, the medians' ratio); met where the whole "
                         "interval is at or above the goal, NOT met where it is below, "
                         "undecided where it holds the goal.", ""]
        ratio = _dp_ratio(rates)
        if ratio:
            notes.append(f"- {ratio}")
        if mode == "time-to-target":
            notes += seed_claims(cells)
        lines += ([""] + notes if notes else []) + [""]
    over = result.get("overhead") or []
    if over:
        lines += ["## Harness overhead: MLflow tracking (metrics, system metrics, tables, "
                  "figures, trace upload) on vs off", "",
                  "(the workers record their spans either way: busy and idle time come "
                  "from them)", ""]
        lines += markdown_table(*overhead_table(over))
        lines.append("")
    return "\n".join(lines)
