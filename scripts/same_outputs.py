"""Regenerate every result that does not depend on timing, for a before/after comparison.

Why: a re-layout must not change what the planner, the simulator, the schedule printer or
the paper reproduction compute. This script runs those commands through the CLI of the
checkout it is pointed at and writes their outputs to one folder, with the few numbers
that are measured (solve times, rows from profiles taken on this CPU) masked. Run it on
two checkouts and ``diff -r`` the folders: no output means byte-identical results.

    python scripts/same_outputs.py --repo /tmp/before --out /tmp/out-before
    python scripts/same_outputs.py --repo . --out /tmp/out-after
    diff -r /tmp/out-before /tmp/out-after
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

PROFILES = Path(__file__).resolve().parent.parent.parent / "shared" / "pipedream-profiles"

# (output name, CLI arguments); {P} is the shared profiles folder, {O} the output folder
COMMANDS = [
    ("planner.md", ["planner-table", "--profiles", "{P}", "-o", "{O}/planner.md"]),
    ("plan-vgg16-A4x4.txt", ["plan", "--profile", "{P}/vgg16/graph.txt", "--cluster", "A:4x4",
                             "-o", "{O}/plan-vgg16-A4x4.json"]),
    ("plan-gnmt-straight.txt", ["plan", "--profile", "{P}/gnmt/graph.txt", "--cluster",
                                "A:1x4", "--straight"]),
    ("plan-resnet50-2019.txt", ["plan", "--profile", "{P}/resnet50/graph.txt", "--cluster",
                                "B:2x8", "--cost-model", "pipedream-2019",
                                "--memory-limit", "16GB"]),
    ("schedule-2-1-1.txt", ["schedule", "--config", "2-1-1", "--minibatches", "8"]),
    ("schedule-mp.txt", ["schedule", "--config", "1-1-1", "--minibatches", "4",
                         "--in-flight", "1", "--weights", "vertical-sync"]),
]
for system in ("pipedream", "gpipe", "mp", "dp"):
    COMMANDS.append((f"simulate-vgg16-A4x4-{system}.txt",
                     ["simulate", "--profile", "{P}/vgg16/graph.txt", "--cluster", "A:4x4",
                      "--system", system]))
for system in ("pipedream-flush", "pipedream-2bw", "torch-interleaved-1f1b", "torch-zbv"):
    COMMANDS.append((f"simulate-vgg16-A1x4-{system}.txt",
                     ["simulate", "--profile", "{P}/vgg16/graph.txt", "--cluster", "A:1x4",
                      "--system", system]))
COMMANDS += [
    ("schedules.md", ["reproduce", "schedules", "--profiles", "{P}", "--quiet",
                      "-o", "{O}/schedules.md"]),
    ("simulate-vgg16-config.txt", ["simulate", "--profile", "{P}/vgg16/graph.txt", "--cluster",
                                   "A:4x4", "--system", "pipedream", "--config", "15-1"]),
    ("simulate-vgg16-plan.txt", ["simulate", "--profile", "{P}/vgg16/graph.txt", "--cluster",
                                 "A:4x4", "--system", "pipedream", "--plan",
                                 "{O}/plan-vgg16-A4x4.json"]),
    ("simulate-gnmt-gpipe.txt", ["simulate", "--profile", "{P}/gnmt/graph.txt", "--cluster",
                                 "A:1x4", "--system", "gpipe", "--stages", "2",
                                 "--microbatches", "6", "--latency", "1e-5"]),
    ("simulate-resnet-ps.txt", ["simulate", "--profile", "{P}/resnet50/graph.txt",
                                "--cluster", "B:2x8", "--system", "dp", "--allreduce", "ps",
                                "--cpu-machines", "1", "--compute-factor", "2"]),
    ("simulate-vgg16-noovl.txt", ["simulate", "--profile", "{P}/vgg16/graph.txt", "--cluster",
                                  "B:1x8", "--system", "dp", "--no-dp-overlap"]),
    ("reproduce-table1.md", ["reproduce", "table1", "--profiles", "{P}", "--quiet",
                             "-o", "{O}/reproduce-table1.md"]),
    ("reproduce-other-tasks.md", ["reproduce", "other-tasks", "--profiles", "{P}", "--quiet",
                                  "-o", "{O}/reproduce-other-tasks.md"]),
    ("reproduce-gpipe.md", ["reproduce", "gpipe", "--profiles", "{P}", "--quiet",
                            "-o", "{O}/reproduce-gpipe.md"]),
]


def _mask(name: str, text: str) -> str:
    """Hide what is measured: solve times, and table rows from profiles taken on this CPU."""
    if name == "planner.md":
        text = re.sub(r"\d+\.\d\d s\b", "T s", text)
    lines = [ln for ln in text.splitlines() if "CPU profile here" not in ln]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=".", help="checkout whose CLI to run")
    ap.add_argument("--out", required=True, help="folder for the outputs")
    ap.add_argument("--profiles", default=str(PROFILES), help="PipeDream graph.txt folder")
    args = ap.parse_args()
    repo, out = Path(args.repo).resolve(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "200", "TERM": "dumb"}
    for name, argv in COMMANDS:
        argv = [a.replace("{P}", args.profiles).replace("{O}", str(out)) for a in argv]
        print(f"pipebench {' '.join(argv)}", file=sys.stderr)
        proc = subprocess.run([sys.executable, "-c", "from harness.cli import main; main()",
                               *argv], cwd=repo, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{name}: exit code {proc.returncode}\n{proc.stderr}")
        target = out / name
        text = target.read_text() if name.endswith(".md") else proc.stdout
        target.write_text(_mask(name, text.replace(str(out), "OUT")))
    for png in out.glob("*.png"):
        png.unlink()  # plots: pixels include the measured rows


if __name__ == "__main__":
    main()
