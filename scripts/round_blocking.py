"""Would judging a suite's repeats within their rounds make the regression rule see more?
Re-judges the power trials' stored runs three ways, into results/round-blocking.md.

Why: a suite runs its repeats in rounds (``harness.experiments.suite_run``: repeat 1 of
every cell, then repeat 2, ...), so the cells of one round share the machine's state in
those minutes, and a round in which every cell ran slow is common here. The rounds are
the blocks of a randomised complete block design, and the textbook analysis takes each
block's effect out of the cells' noise. Here, for each cell, round ``r``'s effect is the
median over the *other* cells of their log deviation from their own mean in that round
(leaving the cell out keeps the effect independent of the cell's own noise), centred over
the rounds; the cell's log value minus that effect is what the rule is given. Centring
leaves every cell's mean log as it was, so a regression, even one that slows every cell
alike, is untouched: only the repeats' scatter about a result's level shrinks. The
question is what that does to the rule's two error rates, which this measures on runs
already made (nothing runs; seconds):

- the repeats' deviation of each cell's steady throughput (the rule's noise in a pair);
- ``between.inflation``: how much more the runs' means vary than their repeats predict
  (the pair test takes the repeats as the whole noise, so a ratio above 1 is false
  alarms it does not count);
- false alarms: A/A pairs (each A run against the one before) with any flag;
- power: planted cells flagged on a throughput figure, other cells flagged,

each by ``pipebench regressions``' own rule (``regressions.compare_at_rate``, a pair at a
false-alarm rate of ``verdicts.SUITE_ALPHA`` per comparison), three ways:

- ``own reference``: each repeat's drift-cancelled figures over the drift reference timed
  just before it (the definition before ``results.with_drift_cancelled`` took the round's);
- ``round reference``: as results are read today, each repeat's drift-cancelled figures
  over the median reference of its round's cells (the reference runs none of our code,
  so, unlike blocking, no cell's regression can move another cell's figure);
- ``blocked``: the round reference's figures, each cell's repeats then blocked as above.

The deviation and the between-runs ratio are given for the steady throughput raw and
drift-cancelled, the figure the two definitions differ in.

    .venv/bin/python scripts/round_blocking.py results/power-runs-r8 ... \\
        -o results/round-blocking.md

A trial is a --workdir of ``scripts/nightly_power.py`` (``aa-*.json``, and
``plant-SYSTEM+SYSTEM-FACTOR.json``, ``nightly_power.plant_file``: the systems planted).
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from nightly_power import _flags, planted_systems  # noqa: E402 - its runs, its judging

from core.markdown import markdown_table  # noqa: E402
from harness import metrics  # noqa: E402
from harness.reporting import between, verdicts  # noqa: E402
from harness.reporting.results import load_result, summarise  # noqa: E402

BLOCKED = (*metrics.THROUGHPUT_FIGURES, metrics.CPU_PER_SAMPLE, metrics.CPU_PER_REFERENCE)
MIN_CELLS = 4  # the cell and at least three others to take a round's effect from
STEADY = (metrics.STEADY_THROUGHPUT, metrics.STEADY_PER_REFERENCE)


def _deviations(cells: list[dict], name: str, rounds: int) -> dict[str, list[float]]:
    """Each ok cell with ``name`` measured in every round (a failed cell is not retried,
    so an ok cell has one value per round, in round order): its logs' deviations from
    their mean."""
    out = {}
    for c in cells:
        values = c.get("metrics", {}).get(name, {}).get("values", [])
        if c.get("status") == "ok" and len(values) == rounds and \
                len(verdicts.log_values(values)) == rounds:
            logs = verdicts.log_values(values)
            out[c["key"]] = [x - sum(logs) / rounds for x in logs]
    return out


def block(result: dict) -> dict:
    """``result`` with its ``BLOCKED`` figures' repeats corrected for their rounds."""
    rounds = int(result["suite"]["repeats"])
    cells = [dict(c, metrics=dict(c.get("metrics", {}))) for c in result["cells"]]
    by_key = {c["key"]: c for c in cells}
    for name in BLOCKED:
        devs = _deviations(cells, name, rounds)
        if len(devs) < MIN_CELLS or rounds < 2:
            continue
        for key in devs:
            raw = [statistics.median(d[r] for k, d in devs.items() if k != key)
                   for r in range(rounds)]
            fx = [e - sum(raw) / rounds for e in raw]
            m = by_key[key]["metrics"][name]
            by_key[key]["metrics"][name] = dict(m, values=[
                v * math.exp(-e) for v, e in zip(m["values"], fx, strict=True)])
    return dict(result, cells=cells)


def own_reference(result: dict) -> dict:
    """``result`` with each drift-cancelled figure over each repeat's own reference (the
    former definition), where the raw figure and the reference pair up repeat by repeat."""
    cells = [dict(c, metrics=dict(c.get("metrics", {}))) for c in result["cells"]]
    for c in cells:
        stats = c["metrics"]
        speeds = stats.get(metrics.REFERENCE_SPEED, {}).get("values", [])
        for raw, cancelled in metrics.DRIFT_PAIRS.items():
            values = stats.get(raw, {}).get("values", [])
            stat = summarise(metrics.cancel_drift(raw, v, s)
                             for v, s in zip(values, speeds, strict=False))
            if stat is not None and stat.n == len(values) == len(speeds):
                stats[cancelled] = stat.to_json()
    return dict(result, cells=cells)


def _sd(result: dict, name: str) -> float:
    """The median over cells of figure ``name``'s repeats' deviation (logs)."""
    sds = [verdicts.noise([c["metrics"][name]["values"]])
           for c in result["cells"] if name in c.get("metrics", {})]
    return statistics.median(s for s in sds if math.isfinite(s))


def _trial(work: Path, way) -> dict:  # noqa: ANN001 - a WAYS function
    """One trial judged one way: its numbers for the table."""
    aa = [way(load_result(p)) for p in sorted(work.glob("aa-*.json"))]
    plants = [(planted_systems(p), way(load_result(p)))
              for p in sorted(work.glob("plant-*.json"))]
    false = [bool(_flags(a, b)) for a, b in zip(aa, aa[1:], strict=False)]
    hits = planted = others = 0
    for systems, res in plants:
        flags = _flags(aa[0], res)
        keys = {c["key"] for c in aa[0]["cells"] if c["system"] in systems}
        planted += len(keys)
        hits += len({c.cell for c in flags if c.cell in keys and c.verdict == "regression"
                     and c.name in metrics.THROUGHPUT_FIGURES})
        others += len({c.cell for c in flags if c.cell not in keys})
    every = aa + [r for _, r in plants]
    return {"repeats": aa[0]["suite"]["repeats"], "runs": len(aa) + len(plants),
            "sd": [statistics.median(_sd(r, n) for r in every) for n in STEADY],
            "ratio": [between.inflation(aa, n).ratio for n in STEADY],
            "false": (sum(false), len(false)), "hits": (hits, planted), "others": others}


WAYS = {"own reference": own_reference, "round reference": lambda r: r, "blocked": block}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trials", nargs="+", help="nightly_power.py --workdir folders")
    ap.add_argument("-o", "--output", default="results/round-blocking.md")
    args = ap.parse_args()
    rows, total = [], {label: [0, 0, 0, 0, 0] for label in WAYS}
    for work in map(Path, args.trials):
        for label, way in WAYS.items():
            t = _trial(work, way)
            for i, v in enumerate((*t["false"], *t["hits"], t["others"])):
                total[label][i] += v
            rows.append((str(work), label, str(t["repeats"]), str(t["runs"]),
                         *(f"{100 * x:.1f}%" for x in t["sd"]),
                         *(f"{x:.2f}" for x in t["ratio"]),
                         f"{t['false'][0]} of {t['false'][1]}",
                         f"{t['hits'][0]} of {t['hits'][1]}", str(t["others"])))
    summary = [f"- {label}: A/A pairs with a false alarm {v[0]} of {v[1]}; planted cells "
               f"flagged {v[2]} of {v[3]}; other cells flagged in planted runs {v[4]}"
               for label, v in total.items()]
    lines = ["# Judging repeats within their rounds (the drift reference's round, blocking), "
             "on the power trials' runs", "",
             f"Generated by `.venv/bin/python scripts/round_blocking.py "
             f"{shlex.join(sys.argv[1:])}`: nothing ran, the trials' stored suite runs "
             "were re-judged by the rule of `pipebench regressions` at this commit "
             f"({verdicts.rule_text()}), three ways: the drift-cancelled figures over each "
             "repeat's own drift reference (the former definition), over its round's "
             "(today's), and today's with each cell's repeats corrected for their rounds' "
             "effect (blocked; the script's docstring says how).", "",
             "sd: the median over the trial's runs of the median over cells of the steady "
             "throughput's repeats' deviation (logs), raw and drift-cancelled; between: "
             "`between.inflation` of the same over the A runs (the runs' means' variance "
             "over what their repeats predict; 1: the repeats tell the whole noise); false "
             "alarms: A/A pairs "
             "with any flag; planted: planted cells flagged on a throughput figure; others: "
             "cells not planted flagged in the planted runs.", "",
             *markdown_table(("trial", "judged", "repeats", "runs", "sd", "sd cancelled",
                              "between", "between cancelled",
                              "A/A pairs with a false alarm", "planted flagged", "others"),
                             rows), "", "Over the trials:", "", *summary, ""]
    Path(args.output).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
