"""What moderating each cell's noise over the cells buys and costs, on kept suite results.

Why: ``harness/reporting/moderation.py`` changes every MDC and threshold the regression
rule states; its tests check the false-alarm rate on simulated cells. This sets the rule
with and without it side by side on results this machine made: for every comparison
named, the judged throughput figures' MDCs (median and how many can see 10% and 20%),
the flags either way (on one commit every flag is a false alarm), and each figure's
prior (its degrees of freedom ``d0`` and how many independent cells its cells count as:
the raw figures' nights move together here, the drift-cancelled ones' hardly).

    python scripts/moderation_gain.py --runs 'results/power-runs-nightly/aa-*.json' \\
        --history results/nightly/nightly.json -o results/moderation-gain.md

Every consecutive pair of ``--runs`` (in the order they ran) is judged as ``pipebench
regressions --baseline A --current B`` would judge it; with ``--history``, that result is
also judged as the nightly judges a night against those of ``--runs`` made before it
(``--history`` ``verdicts.NIGHTLY_WINDOW``; the result itself left out where it is one of
them).
"""

from __future__ import annotations

import argparse
import glob
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.markdown import markdown_table  # noqa: E402
from harness import metrics  # noqa: E402
from harness.reporting import regressions, verdicts  # noqa: E402
from harness.reporting.results import load_result, ok_cells  # noqa: E402
from harness.reporting.store import file_history  # noqa: E402
from harness.reporting.tracking import git_sha  # noqa: E402

THROUGHPUTS = metrics.THROUGHPUT_FIGURES


def _row(what: str, moderate: bool, changes: list[regressions.Change]) -> tuple:
    mdcs = [c.mdc for c in regressions.judged(changes) if c.name in THROUGHPUTS]
    flags = sum(c.verdict in verdicts.BROKEN for c in changes)
    median = f"{100 * statistics.median(mdcs):.1f}%" if mdcs else "-"
    return (what, "yes" if moderate else "no", str(len(mdcs)), median,
            str(sum(m <= 0.10 for m in mdcs)), str(sum(m <= 0.20 for m in mdcs)), str(flags))


def _judged(runs: list[dict], night: dict | None, history: list[dict], moderate: bool
            ) -> list[tuple]:
    """Each pair and the night (against ``history``), judged at the level the reports use,
    moderated or not."""
    rows = [_row(f"A{i} vs A{i + 1}", moderate,
                 regressions.compare_at_rate([runs[i - 1]], runs[i], moderate=moderate)[0])
            for i in range(1, len(runs))]
    if night is not None:
        rows.append(_row("night vs the runs", moderate, regressions.over_nights_at_rate(
            history, night, verdicts.NIGHTLY_WINDOW, moderate=moderate)[0]))
    return rows


def _priors(runs: list[dict], night: dict | None, history: list[dict]) -> list[tuple]:
    """Each throughput figure's prior, in the last pair and (history mode) the night."""
    cases = [("last pair", [runs[-2]], runs[-1])]
    if night is not None:
        cases.append(("night", regressions.judged_against(history, verdicts.NIGHTLY_WINDOW),
                      night))
    rows = []
    for what, base, cur in cases:
        fitted = regressions.priors(ok_cells(base), regressions.cells_by_key(cur))
        for (name, by_results), p in sorted(fitted.items()):
            if name in THROUGHPUTS:
                rows.append((what, name, "results" if by_results else "repeats",
                             str(p.cells), f"{p.effective:.1f}", f"{p.d0:.1f}",
                             f"{p.s0sq ** 0.5:.1%}"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", required=True, help="a glob of suite results, one commit's")
    ap.add_argument("--history", default=None, help="a result judged against --runs")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    paths = sorted(glob.glob(args.runs))
    if len(paths) < 2:
        sys.exit(f"--runs {args.runs!r}: needs two or more results, found {len(paths)}")
    loaded = sorted(zip((load_result(p) for p in paths), paths, strict=True),
                    key=lambda rp: rp[0]["created"])  # A1, A2, ... in the order they ran
    runs, paths = [r for r, _ in loaded], [p for _, p in loaded]
    night = load_result(args.history) if args.history else None
    # the night's history: the runs made before it, itself left out where it is one of
    # them (the rule `regressions --history-dir` reads a directory by)
    history = file_history(night, len(runs), "", runs) if night else []
    if night and len(history) < 2:
        sys.exit(f"--history {args.history}: fewer than two of --runs were made before it")
    rows = [r for pair in zip(_judged(runs, night, history, False),
                              _judged(runs, night, history, True),
                              strict=True) for r in pair]
    lines = [
        "# Moderated noise against each cell's own, on kept results", "",
        f"Generated by `python scripts/moderation_gain.py {shlex.join(sys.argv[1:])}` at git "
        f"{git_sha()} (the runs': " + ", ".join(
            f"{Path(p).name} {r['environment']['git_sha']}" for p, r in zip(
                paths, runs, strict=True)) + "). Each comparison at the level the reports "
        f"use (`{verdicts.SUITE_ALPHA:g}` per comparison over its judged metrics); the "
        "judged throughput figures' MDCs (at 90% power) and the flags on any metric, each "
        "cell's noise its own (`moderate`: no) or moderated over the comparison's cells "
        "(`harness/reporting/moderation.py`). Runs of different commits and days differ by "
        "more than their repeats, so their flags are not all false alarms (see "
        "`results/nightly-aa.md`).", "",
        *markdown_table(("comparison", "moderate", "judged throughput figures",
                         "median MDC", "MDC <= 10%", "MDC <= 20%", "flags"), rows), "",
        "Each throughput figure's prior: the cells it was fitted over, what they are worth "
        "as independent cells (Kish's effective number from the correlation of their "
        "deviations), `d0` (capped at what the other cells know) and the typical noise "
        "`s0`.", "",
        *markdown_table(("comparison", "figure", "units", "cells", "worth", "d0", "s0"),
                        _priors(runs, night, history)), ""]
    Path(args.output).write_text("\n".join(lines))
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
