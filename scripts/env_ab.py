"""What one environment setting does to `pipebench bench`'s steady throughput, run by run.

Some of the runtime's choices are switched by environment variables (``PIPEBENCH_RECV_AHEAD``,
``PIPEBENCH_ALLREDUCE_BUCKET_MB``). On this 2-core machine whole runs of one configuration
can differ by more than such a setting's effect, so a few repeats inside one ``bench`` call
cannot tell them apart. This script runs ``pipebench bench <args> --repeats 1`` many
times in fresh processes: A (the environment as it is, with the variables unset) and B
(with ``--set``), alternating A-B and B-A from round to round so that drift falls on both.
For each cell it reports the steady samples/s of every run, each side's median, B / A, and
a two-sided Mann-Whitney U test of the two sets of runs (scipy's default method: exact
for small samples without ties, else the normal approximation; no assumption about the
runs' distribution). A run that fails, or a cell missing from a run, is reported, not
fatal.

The machine's speed drifts by more than most settings' effects between runs minutes apart
(the report's "all threads' CPU s" row gives each run's CPU seconds for the same work), and
the unpaired test above spends that drift as noise. So each round's A and B, run back to
back, are also compared as a pair: per round B / A of the steady samples/s and of the
drift-cancelled steady samples per reference iteration (the bench's fixed torch loop,
measured before each cell, ``harness.experiments.reference``), the median of the rounds'
ratios and a two-sided Wilcoxon signed-rank test of their logs (exact for these few
rounds: every way of flipping the signs is equally likely where B does nothing).

Beside throughput it reads, every ``SAMPLE_S`` seconds, the kernel's per-thread schedstat of
every process the run starts, and reports per run the CPU seconds of gloo's transport loop
threads, of all threads, and the time threads spent runnable but waiting for a core: where
a setting moves work onto gloo's threads, or makes threads queue for the 2 cores, it shows
there. (Reading costs a few milliseconds each time, on both sides alike.) From each
run's result it also takes what the actions cost each worker's main thread (the cells'
``actions``, from the ``action_cpu_s_<kind>_worker_<r>`` metrics and kin): the CPU time,
time off the core, preemptions and page faults of its compute actions and of its sends, per
minibatch, and the same less the time off the core of its receives (a receive's wall time
holds its wait for the message; its CPU time is the receive's own work, settling delivered
sends included); and each cell's peak memory.

Usage: ``.venv/bin/python scripts/env_ab.py --set PIPEBENCH_RECV_AHEAD=0 --rounds 10
-o results/recv-ahead-ab-vgg16-b4.md -- --workload vgg16 --systems pipedream-flush --batch-size 4
--steps 12 --epochs 3``. Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from scipy.stats import mannwhitneyu, wilcoxon

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.markdown import write_report  # noqa: E402
from harness.metrics import PEAK_MEMORY_MAX, STEADY_PER_REFERENCE, STEADY_THROUGHPUT  # noqa: E402
from harness.reporting.action_costs import GROUPS, grouped  # noqa: E402
from harness.reporting.tracking import git_sha  # noqa: E402
from pipedream_impl.runtime.transport_yield import THREAD_NAME as GLOO_LOOP  # noqa: E402

METRIC = STEADY_THROUGHPUT
CANCELLED = STEADY_PER_REFERENCE  # METRIC over the fixed reference loop's speed
PAIRED = (METRIC, CANCELLED)
OWN_FLAGS = ("--repeats", "--json", "-o", "--output", "--quiet")
THREAD_FIGURES = ("gloo loop threads' CPU s", "all threads' CPU s",
                  "s runnable, waiting for a core")
SAMPLE_S = 0.2  # how often the run's threads are read (a thread's last reading counts)
USE_FIGURES = ("CPU ms", "off core ms", "preemptions", "faults")  # of action_costs.FIGURES
RECEIVES = "receives (RF, RB, RT)"  # a group of their own here: their CPU, not their wall
USE_GROUPS = {**GROUPS, RECEIVES: ("RF", "RB", "RT")}
MEMORY = " peak memory MB"  # the end of each cell's memory figure's name


def _env(assignments: list[str], side: str) -> dict[str, str]:
    env = dict(os.environ)
    for a in assignments:
        name, _, value = a.partition("=")
        env.pop(name, None)
        if side == "B":
            env[name] = value
    return env


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it, from /proc's parent links."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:  # the command may hold spaces and parentheses: the fields follow the last ')'
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1]
                                              .split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, grew = {root}, True
    while grew:
        below = {pid for pid, pp in parent.items() if pp in out} - out
        out |= below
        grew = bool(below)
    return out


def _sample(root: int, seen: dict[tuple[int, int], tuple[str, int, int]]) -> None:
    """Record each thread's name, CPU and run-queue nanoseconds so far (the kernel's
    /proc/PID/task/TID/schedstat: time on a CPU, time runnable but waiting for one)."""
    for pid in _descendants(root):
        try:
            tids = [t.name for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            task = Path(f"/proc/{pid}/task/{tid}")
            try:
                run_ns, wait_ns = map(int, (task / "schedstat").read_text().split()[:2])
                seen[(pid, int(tid))] = ((task / "comm").read_text().strip(), run_ns, wait_ns)
            except (OSError, ValueError):
                continue


def _threads(seen: dict[tuple[int, int], tuple[str, int, int]]) -> dict[str, float]:
    return {THREAD_FIGURES[0]: sum(r for n, r, _ in seen.values() if n == GLOO_LOOP) / 1e9,
            THREAD_FIGURES[1]: sum(r for _, r, _ in seen.values()) / 1e9,
            THREAD_FIGURES[2]: sum(w for _, _, w in seen.values()) / 1e9}


def _run(bench_args: list[str], env: dict[str, str],
         json_path: Path) -> tuple[dict[str, dict[str, float]], dict[str, float]] | None:
    """One bench run: each cell's figures (``PAIRED``, those it has), and its processes'
    thread figures with its workers' thread use (``_thread_use``)."""
    cmd = [str(ROOT / ".venv/bin/pipebench"), "bench", *bench_args, "--repeats", "1",
           "--json", str(json_path), "-o", str(json_path.with_suffix(".md")), "--quiet"]
    seen: dict[tuple[int, int], tuple[str, int, int]] = {}
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None:
            _sample(proc.pid, seen)
            time.sleep(SAMPLE_S)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if proc.returncode != 0 or not json_path.exists():
        print(f"env_ab: `{shlex.join(cmd)}` failed ({proc.returncode}), counted as failed:\n"
              f"{stderr[-2000:]}", file=sys.stderr)
        return None
    cells = json.loads(json_path.read_text())["cells"]
    return ({c["key"]: {k: c["metrics"][k]["median"] for k in PAIRED
                        if k in c.get("metrics", {})} for c in cells
             if METRIC in c.get("metrics", {})},
            {**_threads(seen), **_thread_use(cells), **_memory(cells)})


def _memory(cells: list[dict]) -> dict[str, float]:
    """Each cell's peak memory in MB (``metrics.PEAK_MEMORY_MAX``: its busiest worker's,
    what the training added): ``"cell peak memory MB"`` -> value."""
    return {f"{c['key']}{MEMORY}": c["metrics"][PEAK_MEMORY_MAX]["median"] / 1e6
            for c in cells if PEAK_MEMORY_MAX in c.get("metrics", {})}


def _thread_use(cells: list[dict]) -> dict[str, float]:
    """What each cell's actions cost its workers' main threads, per minibatch, by group of
    kinds (the result's ``actions``, ``action_costs.grouped``): ``"cell w0 sends (SF, SB)
    CPU ms"`` -> value."""
    out = {}
    for c in cells:
        costs = {int(w): kinds for w, kinds in (c.get("actions") or {}).items()}
        for w, groups in grouped(costs, USE_GROUPS).items():
            for group, figures in groups.items():
                out.update({f"{c['key']} w{w} {group} {f}": figures[f] for f in USE_FIGURES
                            if f in figures and not (group == RECEIVES and f == "off core ms")})
    return out


@dataclass
class Measured:
    """cell -> side -> steady samples/s of each run; (cell, figure) -> the (A, B) pair of
    each round that has both; thread figure -> side -> its value in each run; the runs of
    each side that failed."""
    runs: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    threads: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {f: {"A": [], "B": []} for f in THREAD_FIGURES})
    failed: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})


def measure(bench_args: list[str], assignments: list[str], rounds: int,
            workdir: Path) -> Measured:
    """A and B alternating, A-B then B-A, ``rounds`` times."""
    m = Measured()
    for r in range(rounds):
        this: dict[str, dict[str, dict[str, float]]] = {}  # side -> this round's cells
        for side in ("AB" if r % 2 == 0 else "BA"):
            got = _run(bench_args, _env(assignments, side), workdir / f"{side}-{r}.json")
            if got is None:
                m.failed[side] += 1
                continue
            this[side] = got[0]
            for key, figures in got[0].items():
                m.runs.setdefault(key, {"A": [], "B": []})[side].append(figures[METRIC])
            for figure, value in got[1].items():
                m.threads.setdefault(figure, {"A": [], "B": []})[side].append(value)
            print(f"env_ab: round {r + 1}/{rounds} {side} done", file=sys.stderr)
        for key, a in this.get("A", {}).items():
            b = this.get("B", {}).get(key, {})
            for figure in PAIRED:
                if figure in a and figure in b:
                    m.pairs.setdefault((key, figure), []).append((a[figure], b[figure]))
    return m


def _row(name: str, a: list[float], b: list[float], digits: int,
         positive: bool = True) -> str:
    """One figure's runs, A against B. ``positive``: a figure of 0 or less is no
    measurement (a throughput); else zero is data (a count of preemptions), and B / A is
    shown where A's median is above 0."""
    if not a or not b or (positive and min(a + b) <= 0):
        return (f"| {name} | n/a: {len(a)} A run(s), {len(b)} B run(s) with a positive "
                "figure | | | | | |")
    p = mannwhitneyu(a, b, alternative="two-sided").pvalue
    ma, mb = statistics.median(a), statistics.median(b)
    ratio = f"{mb / ma:.2f}" if ma > 0 else "-"
    return (f"| {name} | {ma:.{digits}f} | {mb:.{digits}f} | {ratio} | {p:.3f} | "
            f"{', '.join(f'{v:.{digits}f}' for v in sorted(a))} | "
            f"{', '.join(f'{v:.{digits}f}' for v in sorted(b))} |")


def _paired_row(name: str, figure: str, pairs: list[tuple[float, float]]) -> str:
    """A cell's figure over the rounds: the median of the rounds' B / A, their range, and
    the two-sided exact Wilcoxon signed-rank p of their logs."""
    ratios = [b / a for a, b in pairs if a > 0 and b > 0]
    if len(ratios) < 2:
        return f"| {name} | {figure} | n/a: {len(ratios)} round(s) with both sides | | | |"
    logs = [math.log(x) for x in ratios]
    used = [x for x in logs if x != 0.0]  # a round with B = A carries no sign: dropped
    p = wilcoxon(used, alternative="two-sided", method="exact").pvalue if used else 1.0
    return (f"| {name} | {figure} | {statistics.median(ratios):.3f} | "
            f"{min(ratios):.3f}-{max(ratios):.3f} | {p:.3g} ({len(used)}) | "
            f"{', '.join(f'{x:.3f}' for x in ratios)} |")


def report(m: Measured, assignments: list[str], command: str, git: str) -> str:
    b = " ".join(assignments)
    head = "| {} | A median | B median | B / A | p | A runs (sorted) | B runs (sorted) |"
    lines = [f"# `{b}` against the default: steady throughput, run by run", "",
             f"Generated by `{command}` on "
             f"{datetime.now(UTC):%Y-%m-%d}; {platform.machine()}, "
             f"{os.cpu_count()} cores, git {git}.", "",
             "Each run is one `pipebench bench --repeats 1` in fresh processes; A: the "
             f"variables unset, B: `{b}`; rounds alternate A-B and B-A. Steady samples/s "
             "(per-step timestamps, warm-up and fill/drain excluded). p: two-sided "
             "Mann-Whitney U test of A's runs against B's.", "",
             head.format("cell"), "|---|---|---|---|---|---|---|"]
    lines += [_row(key, s["A"], s["B"], 0) for key, s in sorted(m.runs.items())]
    lines += ["", "Paired by round: each round's A and B ran back to back, so drift slower "
              "than a round falls on both. B / A per round (in the rounds' order) of the "
              f"steady samples/s (`{METRIC}`) and of the same over the fixed reference "
              f"loop's speed measured before each cell (`{CANCELLED}`, drift-cancelled); "
              "p (n): two-sided exact Wilcoxon signed-rank test of the logs of the rounds' "
              "ratios (no effect: each round's sign as likely either way), over the n "
              "rounds whose ratio is not exactly 1; the smallest p it can give is 2 / 2^n "
              "(tied ratios round its statistic).", "",
              "| cell | figure | median B / A | range | p | rounds' B / A |",
              "|---|---|---|---|---|---|"]
    lines += [_paired_row(key, figure, m.pairs[(key, figure)])
              for key, figure in sorted(m.pairs)]
    lines += ["", "The threads of every process each run started (its cells, start-up and "
              "evaluation included), read from the kernel's per-thread schedstat every "
              f"{SAMPLE_S:g} s (a thread's last reading counts): the CPU seconds of gloo's "
              f"transport loop threads (`{GLOO_LOOP}`), of all threads, and the seconds "
              "threads spent runnable but waiting for a core.", "",
              head.format("figure, per run"), "|---|---|---|---|---|---|---|"]
    lines += [_row(f, m.threads[f]["A"], m.threads[f]["B"], 2) for f in THREAD_FIGURES]
    memory = sorted(f for f in m.threads if f.endswith(MEMORY))
    if memory:
        lines += ["", "Each cell's peak memory, MB: what the training added to its busiest "
                  "worker (`peak_memory_bytes_max`; on the CPU the resident set's peak above "
                  "what was resident before the model was built). p: as above.", "",
                  head.format("cell, figure"), "|---|---|---|---|---|---|---|"]
        lines += [_row(f, m.threads[f]["A"], m.threads[f]["B"], 1) for f in memory]
    use = sorted(f for f in m.threads if f not in THREAD_FIGURES and f not in memory)
    if use:
        lines += ["", "What the actions cost each worker's main thread, per minibatch, in "
                  "each cell's run (its thread-use metrics: `pipedream_impl/runtime/"
                  "thread_use.py`; actions timed on the host's clock), summed over the "
                  "kinds of each group: CPU time, time off the core (the group's wall time "
                  "above its CPU time: preempted, or woken late; not for receives, whose "
                  "wall time holds the wait for the message), involuntary context "
                  "switches and minor page faults. p: as above; B / A '-' where A's median "
                  "is 0.", "",
                  head.format("cell, worker, actions, figure"), "|---|---|---|---|---|---|---|"]
        lines += [_row(f, m.threads[f]["A"], m.threads[f]["B"], 3, positive=False)
                  for f in use]
    if any(m.failed.values()):
        lines += ["", f"Runs that failed (left out): A {m.failed['A']}, B {m.failed['B']}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", required=True, metavar="NAME=VALUE",
                    help="a variable B sets (repeatable); A leaves it unset")
    ap.add_argument("--rounds", type=int, default=10, help="runs of each side")
    ap.add_argument("-o", "--output", type=Path, help="the report (default: stdout)")
    args = ap.parse_args(argv[:split])
    bench_args = argv[split + 1:]
    if any(a.partition("=")[0] in OWN_FLAGS or (a.startswith("-o") and a != "-o")
           for a in bench_args):
        ap.error(f"the bench arguments may not hold {', '.join(OWN_FLAGS)}: the script sets them")
    if args.rounds < 3:
        ap.error("--rounds must be at least 3: with fewer runs a side no test can reject")
    if any("=" not in a or not a.partition("=")[0] for a in args.set):
        ap.error("--set takes NAME=VALUE")
    command = shlex.join([".venv/bin/python", "scripts/env_ab.py", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="env_ab-") as tmp:
        git = git_sha(untracked=True)  # before the runs: the code they run
        measured = measure(bench_args, args.set, args.rounds, Path(tmp))
    text = report(measured, args.set, command, git)
    write_report(text, args.output, "env_ab")


if __name__ == "__main__":
    main()
