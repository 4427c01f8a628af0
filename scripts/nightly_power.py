"""Measure the regression detector: its false alarms on one commit and its power against a
planted slowdown, into results/nightly-power.md.

Why: a verdict is worth its error rates, and those are measured, not assumed. This runs
``pipebench bench --suite SUITE`` several times on the same commit (A/A: every flag is a
false alarm) and once per planted slowdown (``--plant SYSTEM=slow:*:*:FACTOR`` for each
system named: every compute action of those systems' ranks takes FACTOR times as long;
the systems not planted in a run are its controls), then judges each A run against the
one before it (tonight against last night) and each planted run against the first A run,
with ``pipebench regressions``' own code
(``harness.reporting.regressions``) and tabulates: false alarms per cell and per suite,
which cells the planted slowdown was flagged in (it must be the planted system's cells
only), and each cell's minimum detectable change.

    python scripts/nightly_power.py --suite suites/power.toml --aa 2 \\
        --plant pipedream,ddp=1.1 --plant gpipe,torch-1f1b=1.1 \\
        --plant pipedream,gpipe,ddp,torch-1f1b=1.2 -o results/nightly-power.md

``--repeats N`` runs every cell N times instead of the suite's repeats (e.g. the number
the report's "repeats for 10%" column asks for, to check that prediction). Suite runs are
kept in --workdir (default results/power-runs/) and reused when present,
so a report can be rewritten without running again (--reuse).
"""

from __future__ import annotations

import argparse
import datetime
import math
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.markdown import markdown_table  # noqa: E402
from harness import metrics  # noqa: E402
from harness.reporting import between, moderation, regressions, verdicts  # noqa: E402
from harness.reporting.results import METRICS, load_result, ok_cells  # noqa: E402


def _bench(suite: str, out: Path, plants: list[str], reuse: bool,
           repeats: int | None) -> dict:
    if not (reuse and out.exists()):
        cmd = [sys.executable, "-m", "harness.cli", "bench", "--suite", suite, "--json",
               str(out), "--quiet", "--experiment", "pipebench-power"]
        if repeats is not None:
            cmd += ["--repeats", str(repeats)]
        for plant in plants:
            cmd += ["--plant", plant]
        print("+", " ".join(cmd[2:]), file=sys.stderr, flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return load_result(out)


def plant_file(work: Path, systems: list[str], factor: str) -> Path:
    """Where the run with ``systems`` planted at ``factor`` is kept in ``work``."""
    return work / f"plant-{'+'.join(systems)}-{factor}.json"


def planted_systems(path: Path) -> list[str]:
    """The systems planted in a run kept at ``path`` (``plant_file``'s name read back)."""
    return path.stem[len("plant-"):].rsplit("-", 1)[0].split("+")


def _flags(base: dict, cur: dict) -> list[regressions.Change]:
    """``cur`` judged against ``base`` as `pipebench regressions` judges a pair: its flags."""
    return [c for c in regressions.compare_at_rate([base], cur)[0]
            if c.verdict in verdicts.BROKEN]


# the throughput figures: epoch-based and steady-state, each raw and drift-cancelled; the
# regression rule judges one of each pair (``metrics.THROUGHPUT_PAIRS``, ``regressions``)
THROUGHPUTS = metrics.THROUGHPUT_FIGURES
WINDOW = verdicts.NIGHTLY_WINDOW  # the history `make nightly` judges a night against


def _median(cell: dict, name: str) -> float | None:
    return (cell.get("metrics", {}).get(name) or {}).get("median")


def _spread(cell: dict, name: str) -> str:
    """The repeats' noise as the rule sees it: deviation of the logs, in percent."""
    m = cell.get("metrics", {}).get(name)
    sd = verdicts.noise([m["values"]]) if m else math.nan
    return "-" if math.isnan(sd) else f"{100 * sd:.1f}%"


def _judged(key: str, pairs: list[tuple[int, list[regressions.Change]]]
            ) -> dict[str, list[float]]:
    """The throughput figures of cell ``key`` the rule judged in the pairs (not its noisier
    drift twin, and only with a finite MDC: a noise estimate) -> its MDC in each pair."""
    judged: dict[str, list[float]] = {}
    for _, ch in pairs:
        for c in regressions.judged(ch):
            if c.cell == key and c.name in THROUGHPUTS:
                judged.setdefault(c.name, []).append(c.mdc)
    return judged


def _priors(earlier: list[dict], last: dict, cell_df: float | None = None
            ) -> dict[str, moderation.Prior]:
    """Each throughput figure's prior (``regressions.priors``, ``cell_df`` its) of ``earlier``
    judged with ``last``: over repeats (one result), over results (``HISTORY_RESULTS`` on)."""
    fitted = regressions.priors(ok_cells(earlier), regressions.cells_by_key(last), cell_df)
    history = len(earlier) >= verdicts.HISTORY_RESULTS
    return {n: fitted.get((n, history), moderation.NONE) for n in THROUGHPUTS}


def _moderated(groups: list[list[float]], prior: moderation.Prior, pair: bool = False
               ) -> tuple[float, float]:
    """The deviation ``test`` would use for ``groups`` (``pair``: one result's, taken for
    both of a pair, as ``bench.mdcs``) and the degrees of freedom moderating added (NaN, 0
    without a noise estimate)."""
    dev, df = verdicts.spread(groups, [])
    if not df:
        return math.nan, 0
    own = 2 * df if pair else df  # a pair: one result's repeats taken for both sides
    var, total = prior.moderate_pair(dev, df) if pair else \
        prior.moderate(sum(x * x for x in dev), df)
    return math.sqrt(var), total - own


def _repeats_for(cell: dict, judged: list[str], level: float,
                 priors: dict[str, moderation.Prior] | None = None) -> float | None:
    """The fewest repeats a side at which the stabler judged figure of ``cell`` (its noise
    in this run, moderated by ``priors``: A1 vs A2's) would see a ``verdicts.TARGET_MDC`` change
    in a pair of results tested at ``level`` per metric (inf: over 1000; None: no noise
    estimate)."""
    sds = [_moderated([cell["metrics"][n]["values"]], (priors or {}).get(n, moderation.NONE),
                      True) for n in judged if n in cell.get("metrics", {})]
    sds = [s for s in sds if math.isfinite(s[0])]
    if not sds:
        return None
    sd, extra = min(sds)
    return verdicts.repeats_for(sd, alpha=level, extra_df=extra) or math.inf


def _night_mdc(key: str, runs: list[dict], level: float,
               priors: dict[str, moderation.Prior] | None = None) -> str:
    """What the nightly's two-night label could see in cell ``key``: the A runs taken as
    nights (each its repeats' mean log; their deviation, moderated over the cells, the
    night-level noise), a history of ``WINDOW`` such nights, ``verdicts.consecutive_mdc``
    at ``level`` per metric; of each raw / drift-cancelled pair the figure the rule would
    judge on these nights (``regressions.not_judged``)."""
    cells = [c for r in runs for c in r["cells"] if c["key"] == key]
    loud = regressions.not_judged(cells)
    out = []
    for name in THROUGHPUTS:
        groups = [c["metrics"][name]["values"] for c in cells if name in c.get("metrics", {})]
        if name in loud or len(groups) < verdicts.HISTORY_RESULTS:
            continue
        sd, extra = _moderated(groups, (priors or {}).get(name, moderation.NONE))
        if math.isfinite(sd):
            seen = verdicts.consecutive_mdc(sd, WINDOW, level, df=WINDOW - 1 + extra)
            out.append(f"{name} {100 * seen:.1f}%")
    return ", ".join(out) or "-"


def _need_text(n: float | None) -> str:
    return "-" if n is None else "> 1000" if math.isinf(n) else str(n)


LABELS = ("regression", "suspicious", "improvement", "improvement (one night)")


def _nightly_labels(runs: list[dict]) -> tuple[list[tuple[int, regressions.Change]], int]:
    """Each later A run as `pipebench regressions --history WINDOW` labels it against the
    runs before it (over nights: two breaks in a row a regression, one suspicious): the
    labels with the index of the run they label, and how many runs had a noisy metric the
    rule could label at all."""
    labels, labelled = [], 0
    for k in range(1, len(runs)):
        got = [c for c in regressions.over_nights_at_rate(runs[:k], runs[k], WINDOW)[0]
               if c.name in METRICS]
        labelled += any(c.verdict in LABELS or c.verdict == "changed-within-noise"
                        for c in got)
        labels += [(k, c) for c in got if c.verdict in LABELS]
    return labels, labelled


def _aa_section(base: dict, runs: list[dict]) -> list[str]:
    judged_pairs = {i: regressions.compare_at_rate([runs[i - 1]], r)
                    for i, r in enumerate(runs[1:], 1)}
    pairs = [(i, ch) for i, (ch, _, _) in judged_pairs.items()]
    levels = {i: level for i, (_, level, _) in judged_pairs.items()}
    level = levels[1]  # A1 vs A2's: the level of a pair, for the repeats for 10%
    # the last run as the nightly judges it against the runs before: the level of a night
    night = regressions.night_alpha(runs[:-1], runs[-1], WINDOW)[0]
    labels, labelled = _nightly_labels(runs)
    within, over_runs = _priors(runs[:1], runs[1]), _priors(runs, runs[-1], WINDOW - 1)
    rows, needs = [], []
    for cell in base["cells"]:
        key = cell["key"]
        judged = _judged(key, pairs)
        false = sum(1 for _, ch in pairs for c in ch if c.cell == key
                    and c.verdict in verdicts.BROKEN)
        nightly = [f"A{k + 1} {c.verdict}" for k, c in labels if c.cell == key]
        needs.append(_repeats_for(cell, sorted(judged), level, within))
        rows.append((key, f"{_median(cell, metrics.STEADY_THROUGHPUT) or 0:.0f}",
                     *(_spread(cell, n) for n in THROUGHPUTS),
                     ", ".join(sorted(judged)) or "none (no noise estimate)",
                     ", ".join(f"{100 * statistics.median(v):.1f}%"
                               for _, v in sorted(judged.items())) or "-",
                     _night_mdc(key, runs, night, over_runs),
                     _need_text(needs[-1]), f"{false} of {len(pairs)}",
                     ", ".join(nightly) or "none"))
    flagged = [c for _, ch in pairs for c in ch if c.verdict in verdicts.BROKEN]
    suites = sum(1 for _, ch in pairs if any(c.verdict in verdicts.BROKEN
                                             for c in ch))
    return ["## A/A: the same code run again (every flag is a false alarm)", "",
            "Spreads: the deviation of the repeats' logs (the rule's noise) of each "
            "throughput figure; `judged on`: the figure of each raw / drift-cancelled pair "
            "the rule judged in any pair (the drift-cancelled one where the cell's drift "
            "reference moved, else the one stabler in the baseline; none where a cell has "
            "no noise estimate: one repeat); MDC: the "
            f"smallest change each judged figure would flag with {verdicts.POWER:.0%} "
            "probability (median over the pairs); two nights' MDC: the smallest change "
            "lasting two nights that the nightly's `regression` label would see with "
            f"{verdicts.POWER:.0%} probability against {WINDOW} earlier nights, taking the "
            "A runs as nights (the deviation of their mean logs is the night-level noise), "
            "of each raw / drift-cancelled pair the figure whose nights were stabler "
            f"('-' under {verdicts.HISTORY_RESULTS} runs); repeats for "
            f"{verdicts.TARGET_MDC:.0%}: the fewest repeats a side at which the stabler "
            f"judged figure's noise (in A1) would have an MDC of {verdicts.TARGET_MDC:.0%} "
            "in a pair of results; false alarms: flags on any metric of the cell against "
            "the run before (a pair test); as the nightly labels it: A2, A3, ... each "
            "judged as "
            f"`pipebench regressions --history {WINDOW}` judges a night, against the runs "
            "before it (a break on one night is `suspicious`, on two in a row a "
            "`regression`, each of the two at the rate that makes the pair's rate the "
            f"night's level per metric; under {verdicts.MIN_HISTORY} runs before the night "
            "before, `insufficient data`). Each pair and night is tested at its own level "
            "per metric (the rule's rate per comparison over its judged metrics); the "
            f"repeats for {verdicts.TARGET_MDC:.0%} are at A1 vs A2's level, {level:.2g}, "
            f"and the two nights' MDC at the last run's against the runs before it, "
            f"{night:.2g}. The MDCs and the repeats for {verdicts.TARGET_MDC:.0%} count "
            "each cell's noise as the rule does, moderated by the same figure's over the "
            "cells (`harness/reporting/moderation.py`); the spreads are the cells' own.", "",
            *markdown_table(("cell", "steady samples/s (A1)",
                             *(f"spread {n}" for n in THROUGHPUTS), "judged on", "MDC",
                             "two nights' MDC",
                             f"repeats for {verdicts.TARGET_MDC:.0%}", "false alarms",
                             "as the nightly labels it"), rows),
            "", _budget(base["suite"]["repeats"], needs),
            "", f"Suites with at least one false alarm: {suites} of {len(pairs)} A/A pairs "
            f"({len(flagged)} flags in all).", "", *_by_metric(pairs),
            *between.report(runs, pairs, levels),
            *_by_label(labels, labelled, len(runs))]


def _budget(repeats: int, needs: list[float | None]) -> str:
    """The trade in numbers: the cell runs a suite would need for every judged cell to
    see a ``verdicts.TARGET_MDC`` change, against the cell runs it makes now (its time
    grows about in proportion: each run is a process start-up and a few epochs)."""
    judged = [int(n) for n in needs if n is not None and not math.isinf(n)]
    blind = sum(1 for n in needs if n is not None and math.isinf(n))
    total = sum(max(repeats, n) for n in judged)
    if not judged and blind:  # every cell has a noise estimate too large to help
        return (f"The trade: {blind} cells have a noise estimate, and each would need over "
                f"1000 repeats a side for a {verdicts.TARGET_MDC:.0%} MDC ({repeats} "
                "repeat(s) a cell now).")
    if not judged:
        return (f"The trade: no cell has a noise estimate ({repeats} repeat(s) a cell), so "
                "pair mode judges only exact counters and failures here.")
    return (f"The trade: {len(judged)} cells have a noise estimate; run with {repeats} "
            f"repeats they make {repeats * len(judged)} cell runs, and with the repeats each "
            f"needs for a {verdicts.TARGET_MDC:.0%} MDC (at least {repeats}) "
            f"{total} ({total / max(1, repeats * len(judged)):.1f}x the time)"
            + (f"; {blind} more cells have a noise estimate but would need over 1000 "
               "repeats a side" if blind else "") + ".")


def _moves(cs: list[regressions.Change]) -> tuple[str, str, str]:
    """A group of flags: how many, how far they moved (median and range), which cells (a
    shift of one metric on every cell is the machine between runs, not the cells' noise)."""
    moves = sorted(100 * c.change for c in cs if c.change is not None)
    return (str(len(cs)),
            f"{statistics.median(moves):+.1f}% ({moves[0]:+.1f} to {moves[-1]:+.1f})"
            if moves else "n/a",
            ", ".join(c.cell for c in cs) if len(cs) <= 4 else f"{len(cs)} cells")


def _by_metric(pairs: list[tuple[int, list[regressions.Change]]]) -> list[str]:
    """The false alarms of each pair by metric."""
    rows = []
    for i, ch in pairs:
        by: dict[str, list[regressions.Change]] = {}
        for c in ch:
            if c.verdict in verdicts.BROKEN:
                by.setdefault(c.name, []).append(c)
        for name, cs in sorted(by.items(), key=lambda kv: -len(kv[1])):
            rows.append((f"A{i} vs A{i + 1}", name, *_moves(cs)))
    if not rows:
        return []
    return ["False alarms by metric:", "", *markdown_table(
        ("pair", "metric", "flags", "median change (range)", "cells"), rows), ""]


def _by_label(labels: list[tuple[int, regressions.Change]], labelled: int,
              n_runs: int) -> list[str]:
    """The nightly's labels on the later A runs, by run, label and metric."""
    had = f"{labelled} of the {n_runs - 1} later runs had the history a label needs"
    if not labels:
        return [f"As the nightly labels them: nothing flagged ({had}).", ""]
    by: dict[tuple[int, str, str], list[regressions.Change]] = {}
    for k, c in labels:
        by.setdefault((k, c.verdict, c.name), []).append(c)
    rows = [(f"A{k + 1}", verdict, name, *_moves(cs))  # each run's worst first
            for (k, verdict, name), cs in sorted(by.items(), key=lambda kv: (
                kv[0][0], LABELS.index(kv[0][1]), kv[0][2]))]
    return [f"As the nightly labels them ({had}):", "", *markdown_table(
        ("run", "label", "metric", "flags", "median change (range)", "cells"), rows), ""]


def _planted_section(base: dict, res: dict, systems: list[str], factor: float) -> list[str]:
    flags = _flags(base, res)
    rows, hits = [], 0
    planted = [cell for cell in base["cells"] if cell["system"] in systems]
    for cell in planted:
        key = cell["key"]
        now = next(c for c in res["cells"] if c["key"] == key)
        hit = [c for c in flags if c.cell == key and c.verdict == "regression"
               and c.name in THROUGHPUTS]
        hits += bool(hit)
        b, p = (_median(c, metrics.STEADY_THROUGHPUT) or 0 for c in (cell, now))
        rows.append((key, f"{b:.0f}", f"{p:.0f}", f"{100 * (p / (b or 1) - 1):+.1f}%",
                     ", ".join(c.name for c in hit) or "missed"))
    keys = {cell["key"] for cell in planted}
    other = [c for c in flags if c.cell not in keys]
    return [f"## Planted: every compute action of {', '.join(systems)} {factor:g}x as long",
            "", *markdown_table(("cell", "steady samples/s before", "planted", "change",
                                 "flagged on"), rows),
            "", f"Planted cells flagged: {hits} of {len(rows)}. Other cells flagged: "
            + (", ".join(f"{c.cell} {c.name} ({c.verdict})" for c in other) or "none")
            + ".", ""]


def _names(runs: list[dict], planted: list[tuple]) -> list[tuple[str, dict]]:
    return [*((f"A{i + 1}", r) for i, r in enumerate(runs)),
            *((f"planted {'+'.join(c)} {f:g}x", r) for c, f, r in planted)]


def _same_repeats(results: list[dict], asked: int | None) -> None:
    """Every run must have had the same repeats (``asked`` where given): a reused run made
    with others would make the report's header, and its comparisons, wrong."""
    had = sorted({r["suite"]["repeats"] for r in results})
    if len(had) > 1 or (asked is not None and had != [asked]):
        sys.exit(f"nightly_power.py: the runs had {had} repeats"
                 + (f", not the {asked} asked for" if asked is not None else "")
                 + "; rerun them without --reuse or with another --workdir")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="suites/power.toml")
    ap.add_argument("--aa", type=int, default=2, help="runs on one commit (>= 2)")
    ap.add_argument("--plant", action="append", default=[],
                    help="SYSTEM[,SYSTEM...]=FACTOR: one planted run each")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs of every cell (default: the suite's)")
    ap.add_argument("--workdir", default="results/power-runs")
    ap.add_argument("--reuse", action="store_true", help="reuse suite runs in --workdir")
    ap.add_argument("-o", "--output", default="results/nightly-power.md")
    ap.add_argument("--note", action="append", default=[],
                    help="a caveat about the runs, printed under their list (e.g. a metric "
                         "whose definition changed between two of them)")
    args = ap.parse_args()
    work = ROOT / args.workdir
    work.mkdir(parents=True, exist_ok=True)
    aa_paths = [work / f"aa-{i}.json" for i in range(args.aa)]
    plant_runs = []  # (systems, factor, its --plant flags, its file)
    for spec in args.plant:
        names, factor = spec.split("=")
        chosen = names.split(",")
        plant_runs.append((chosen, factor, [f"{s}=slow:*:*:{factor}" for s in chosen],
                           plant_file(work, chosen, factor)))
    if args.reuse:  # the kept runs' repeats, before any new run is spent on a mismatch
        kept = [p for p in [*aa_paths, *(r[3] for r in plant_runs)] if p.exists()]
        if kept:
            _same_repeats([load_result(p) for p in kept], args.repeats)
    runs = [_bench(args.suite, p, [], args.reuse, args.repeats) for p in aa_paths]
    planted = [(chosen, float(factor), _bench(args.suite, out, plants, args.reuse,
                                              args.repeats))
               for chosen, factor, plants, out in plant_runs]
    _same_repeats([*runs, *(r for _, _, r in planted)], args.repeats)
    base = runs[0]
    lines = [f"# The regression detector, measured ({base['suite']['name']} suite)", "",
             f"Generated by `python scripts/nightly_power.py {shlex.join(sys.argv[1:])}` on "
             f"{datetime.date.today()}; {base['environment']['hardware']}, git "
             f"{base['environment']['git_sha']}; {base['suite']['repeats']} repeats of every "
             "cell in every run. Every A run is judged against the one before "
             "it, every planted run against the first A run, by `pipebench regressions`' "
             f"rule: {verdicts.rule_text()}.", "",
             "The runs: " + "; ".join(
                 f"{name} at git {r['environment']['git_sha']}, {r['created'][:16]}"
                 for name, r in _names(runs, planted)) + ".", ""]
    lines += [*(f"Note: {n}" for n in args.note), *([""] if args.note else [])]
    lines += _aa_section(base, runs)
    for chosen, factor, res in planted:
        lines += _planted_section(base, res, chosen, factor)
    Path(args.output).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
