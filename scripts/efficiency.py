"""Where a 2-stage pipeline's time goes on this machine, against the machine's own ceiling.

The goals (issues 15 and 24): 2-stage PipeDream (2 workers x 1 thread) reaches 0.90 of twice
one single worker's throughput (1 thread) on tiny VGG-16, 0.85 on tiny GNMT-8
(``--workload``). This script measures, repeated with the runs interleaved (throughputs,
over the epochs and in the steady state: median and min-max over repeats; times per
minibatch: means over repeats, so that the parts below add up):

- ``single``: one process, one thread, the whole model;
- two ``single`` runs at once (two processes, one thread each): the aggregate is the most
  two one-thread workers get out of this machine (shared memory bandwidth, caches, the
  host), an independent ceiling for any 2-worker system;
- ``pipedream`` with ``--config 1-1``: its throughput, and from the runtime's per-action
  timings (the ``action_s_<kind>_worker_<r>`` metrics) each worker's time per minibatch
  split into compute (F, B, U), posting sends (SF, SB) and idle time (every receive, RF
  and RB, counts as idle: it waits for the other stage);
- on the runtime's own handlers in one process (``pipedream_impl.runtime.local``: no
  transfer, no waiting, no second process), every epoch counted as in the pipeline: the
  whole model as one stage, and the same two stages (that repeat's split).

From these the busier worker's time per minibatch is taken apart: half of the single
worker's; what the runtime's handlers add on the whole model; what splitting it into two
stages adds; the split's imbalance; what running as two processes at once adds to the same
actions; sending; waiting. What the compute actions cost each worker's main thread
(``pipedream_impl.runtime.thread_use``: CPU time, the kernel's part, page faults,
preemptions; the ``action_cpu_s_<kind>_worker_<r>`` metrics and their kin in the pipeline)
splits the two processes' part into more CPU time on the core and time off it.

Usage: ``.venv/bin/python scripts/efficiency.py [--workload vgg16|gnmt8] [--repeats 3]
[--epochs 3] [--steps 24] [-o results/efficiency-vgg16-tiny.md]``. Nothing else may run on
the machine meanwhile.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import metrics  # noqa: E402
from harness.config import RunConfig  # noqa: E402
from harness.experiments.runner import run, runtime_env  # noqa: E402
from harness.reporting.progress import quiet  # noqa: E402
from harness.reporting.tracking import git_sha  # noqa: E402
from harness.systems import PAPER  # noqa: E402

KINDS = ("F", "B", "U", "SF", "SB", "RF", "RB")
COMPUTE = ("F", "B", "U")
# what the compute actions cost the worker's thread, in thread_use.FIELDS' order:
# (row key, the metric a pipeline run logs it as, its scale into the row's unit)
USE = tuple(zip(("cpu", "sys", "faults", "preempt"), metrics.THREAD_USE, (1e3, 1e3, 1.0, 1.0),
                strict=True))


def _config(system: str, workers: int, args: argparse.Namespace) -> RunConfig:
    return RunConfig.from_flags(system=system, workload=args.workload, scale="tiny",
                                epochs=args.epochs, target=1e9, threads=1, workers=workers,
                                max_steps_per_epoch=args.steps,
                                experiment="pipebench-efficiency",
                                config="1-1" if workers > 1 else None)


def _single(args: argparse.Namespace, out) -> None:  # noqa: ANN001 - a queue
    from harness import systems

    one = next(s.name for s in systems.SYSTEMS if not s.multi_process)
    summary = run(_config(one, 1, args), quiet())
    out.put((summary.throughput, summary.steady.samples_per_s))


def _pipeline(args: argparse.Namespace) -> tuple[tuple[float, float],
                                                 dict[int, dict[str, float]], tuple]:
    """Throughput (over epochs, and in the steady state), each worker's ms per minibatch by
    kind, and the split it ran."""
    summary = run(_config(PAPER["planned"], 2, args), quiet())
    m = summary.final_metrics
    n = sum(e.steps for e in summary.epochs)  # minibatches trained, every epoch
    per = {}
    for r in (0, 1):
        row = {k: 1e3 * m.get(f"action_s_{k}_worker_{r}", 0.0) / n for k in KINDS}
        row["idle"] = 1e3 * m.get(f"idle_s_worker_{r}", 0.0) / n
        row["busy"] = 1e3 * m.get(f"busy_s_worker_{r}", 0.0) / n
        row.update({name: scale * sum(m.get(metrics.key(metric, kind=k, worker=r), 0.0)
                                      for k in COMPUTE) / n for name, metric, scale in USE})
        per[r] = row
    bounds = tuple(tuple(b) for b in summary.layout_params["stages"])
    return (summary.throughput, summary.steady.samples_per_s), per, bounds


def _in_process(args: argparse.Namespace, bounds: tuple, out) -> None:  # noqa: ANN001
    """On the runtime's handlers in this one process, every epoch counted (as the
    pipeline's breakdown is), ms per minibatch of each kind: the pipeline's two stages
    (keys 0 and 1), and the whole model as one stage ("whole")."""
    import torch

    from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
    from pipedream_impl.runtime.local import local_executors, run_local
    from workloads.registry import get

    torch.set_num_threads(1)
    b = get(args.workload).spec("tiny").batch_size
    settings = RunSettings(args.workload, "tiny", 0, b, max_steps=args.steps, timeout_s=60.0)
    got = {}
    for key, layout in (("whole", SystemSettings((1,), ((0, bounds[-1][1]),))),
                        ("split", SystemSettings((1, 1), bounds))):
        executors = local_executors(WorkerSpec(0, settings, layout))
        reports = [run_local(executors, e) for e in range(args.epochs)]
        n = args.epochs * executors[0].n_steps
        rows = [{k: 1e3 * sum(rep[r].action_s.get(k, 0.0) for rep in reports) / n
                 for k in KINDS} for r in range(len(executors))]
        for r, row in enumerate(rows):
            row.update({name: scale * sum(rep[r].action_use[k][i] for rep in reports
                                          for k in COMPUTE if k in rep[r].action_use) / n
                        for i, (name, _, scale) in enumerate(USE)})
        got.update({"whole": rows[0]} if key == "whole" else dict(enumerate(rows)))
    out.put(got)


def _spawned(target, *args, copies: int = 1) -> list:  # noqa: ANN001, ANN002
    """``target(*args, queue)`` in ``copies`` fresh processes at once (every measured run
    here has a process of its own): their results, in the order they arrive."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, q)) for _ in range(copies)]
    for p in procs:
        p.start()
    results: list = []
    while len(results) < copies:
        try:
            results.append(q.get(timeout=5.0))
        except queue.Empty:
            failed = [p.exitcode for p in procs if not p.is_alive() and p.exitcode != 0]
            if failed:
                raise SystemExit(f"{target.__name__} failed (exit codes {failed}); its "
                                 "error is above") from None
    for p in procs:
        p.join()
    return results


def _compute(row: dict[str, float]) -> float:
    return row["F"] + row["B"] + row["U"]


def _off(row: dict[str, float]) -> float:
    """The compute actions' time off the thread's core: wall above CPU time."""
    return _compute(row) - row["cpu"]


def _parts(single_ms: float, alone: dict, piped: dict) -> list[tuple[str, float]]:
    """The busier worker's ms per minibatch (busy + idle), part by part, from the means
    over repeats (``alone``: the in-process rows, ``piped``: the pipeline's); the parts add
    up to the last line. Every worker of a pipeline takes about the same time per
    minibatch; the busier one (the bottleneck) waits least, the other's waiting is mostly
    the split's imbalance."""
    w = max((0, 1), key=lambda r: piped[r]["busy"])
    half, whole = single_ms / 2, _compute(alone["whole"]) / 2
    mean = (_compute(alone[0]) + _compute(alone[1])) / 2
    sent = piped[w]["SF"] + piped[w]["SB"]
    parts = [(f"half of one single worker's minibatch (worker {w}'s ideal share; the single "
              "trainer, warm-up excluded)", half),
             ("+ the runtime's handlers on the whole model as one stage, in one process "
              "(half; warm-up counted here, not in the single's)", whole - half),
             ("+ splitting the model into two stages (half of what the two cost above the "
              "whole, in one process)", mean - whole),
             ("+ the split's imbalance (this stage above the two stages' mean, in one "
              "process)", _compute(alone[w]) - mean),
             ("+ the same actions run as two processes at once: more CPU time on its core",
              piped[w]["cpu"] - alone[w]["cpu"]),
             ("+ the same actions run as two processes at once: off its core (their wall "
              "time above their CPU time)", _off(piped[w]) - _off(alone[w])),
             ("+ posting its sends (SF, SB)", sent),
             ("+ waiting for the other stage (RF, RB: idle)", piped[w]["idle"])]
    other = piped[w]["busy"] - _compute(piped[w]) - sent  # any other busy action kind
    if abs(other) >= 0.005:
        parts.append(("+ other busy actions", other))
    return [*parts, (f"= worker {w}'s time per minibatch (busy + idle)",
                     piped[w]["busy"] + piped[w]["idle"])]


def _stat(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def _measure(args: argparse.Namespace) -> dict[str, list]:
    """Every measurement, ``--repeats`` times, interleaved."""
    # alone, pair, pipe: (over epochs, steady state) samples/s of each repeat
    got: dict[str, list] = {k: [] for k in ("alone", "pair", "pipe", "piped", "inproc",
                                            "splits")}
    for i in range(args.repeats):
        got["alone"].append(_spawned(_single, args)[0])
        both = _spawned(_single, args, copies=2)  # the aggregate of the two
        got["pair"].append(tuple(map(sum, zip(*both, strict=True))))
        rates, per, bounds = _pipeline(args)
        got["pipe"].append(rates)
        got["piped"].append(per)
        got["splits"].append(list(bounds))
        got["inproc"].append(_spawned(_in_process, args, bounds)[0])
        print(f"repeat {i + 1}: single {got['alone'][-1][0]:.1f}, two singles "
              f"{got['pair'][-1][0]:.1f}, pipedream 1-1 {rates[0]:.1f} samples/s (split "
              f"{list(bounds)})", file=sys.stderr, flush=True)
    return got


def _mean_rows(rows: list[dict]) -> dict:
    """Each key's row, every kind's mean over repeats (means add up; medians need not)."""
    return {r: {k: statistics.fmean(x[r][k] for x in rows) for k in rows[0][r]}
            for r in rows[0]}


def _report(args: argparse.Namespace, got: dict[str, list]) -> str:
    from workloads.registry import get

    def col(key: str, i: int) -> list[float]:  # i: 0 over epochs, 1 steady state
        return [x[i] for x in got[key]]

    def of_two(key: str, i: int) -> str:  # each repeat's figure over twice its single's
        pairs = zip(col(key, i), col("alone", i), strict=True)
        return f"{statistics.median(x / (2 * a) for x, a in pairs):.2f}"

    def cells(key: str) -> str:
        return f"{_stat(col(key, 0))} | {of_two(key, 0)} | {_stat(col(key, 1))} | " \
            f"{of_two(key, 1)}"

    piped, inproc = _mean_rows(got["piped"]), _mean_rows(got["inproc"])
    b = get(args.workload).spec("tiny").batch_size
    single_ms = 1e3 * b / statistics.median(col("alone", 0))
    lines = [f"# Runtime efficiency: 2-stage PipeDream vs one worker, tiny {args.workload}",
             "", f"Generated by `scripts/efficiency.py --workload {args.workload} --repeats "
             f"{args.repeats} --epochs {args.epochs} --steps {args.steps}` at git {args.git} "
             f"(CPU, 1 thread per process, runtime switches: {runtime_env()}; runs "
             "interleaved; median "
             "(min-max) over repeats). Over epochs: "
             "the median of the epochs' rates (each epoch's samples over its time, the "
             "warm-up excluded; a pipeline's fill and drain in every epoch counted); the "
             "goal's figure. Steady state: the summed "
             "rate of windows of minibatch completions (`harness.experiments.steady`: "
             "fill, drain and evaluation excluded), what the suites judge; it shows how "
             "much of the gap is these short epochs' fill and drain.",
             "", "| measurement | samples/s over epochs | of 2 x single | steady samples/s "
             "| of 2 x single |", "|---|---|---|---|---|",
             f"| single, alone | {_stat(col('alone', 0))} | - | {_stat(col('alone', 1))} | - |",
             f"| two singles at once (aggregate): the machine's ceiling | {cells('pair')} |",
             f"| pipedream --config 1-1 | {cells('pipe')} |",
             "", "Per stage, ms per minibatch (mean over repeats; every epoch counted, "
             "warm-up included), in the 2-process pipeline (busy + idle = the worker's time "
             "in its actions; every receive counts as idle) and run in one process (there a "
             "send is a local copy and a receive takes it from a list); `whole`: the whole "
             "model as one stage in one process. Splits, one per repeat (the layers are "
             "balanced on a local profile each time): "
             + "; ".join(str(s) for s in got["splits"]) + ".", "",
             "| stage | run | " + " | ".join(KINDS) + " | F+B+U | busy | idle |",
             "|---|---|" + "---|" * (len(KINDS) + 3)]
    for r in (0, 1):
        for name, row in (("pipeline", piped[r]), ("one process", inproc[r])):
            cells = [f"{row[k]:.2f}" for k in KINDS] + [f"{_compute(row):.2f}"] + (
                [f"{row['busy']:.2f}", f"{row['idle']:.2f}"] if "busy" in row else ["-", "-"])
            lines.append(f"| {r} | {name} | " + " | ".join(cells) + " |")
    whole = inproc["whole"]
    lines.append("| whole | one process | " + " | ".join(f"{whole[k]:.2f}" for k in KINDS)
                 + f" | {_compute(whole):.2f} | - | - |")
    lines += _use_table(piped, inproc)
    lines += ["", f"single, alone: {single_ms:.2f} ms per minibatch of {b} samples. The "
              "busier worker's time per minibatch, part by part (ms; the single's figure "
              "excludes the warm-up, the others count every epoch):", "",
              "| part | ms | of the total |", "|---|---|---|"]
    parts = _parts(single_ms, inproc, piped)
    total = parts[-1][1]
    lines += [f"| {name} | {ms:.2f} | {ms / total:.0%} |" for name, ms in parts]
    return "\n".join(lines) + "\n"


def _use_table(piped: dict, inproc: dict) -> list[str]:
    """The compute actions per minibatch, by what they cost the worker's main thread."""
    lines = ["", "The compute actions (F, B, U) per minibatch (means over repeats, every "
             "epoch counted), by what they cost the worker's main thread "
             "(`pipedream_impl/runtime/thread_use.py`): wall and CPU time; of the CPU time "
             "the kernel's part (sampled at its timer tick); off its core (wall above CPU: "
             "preempted, or woken late); minor page faults and involuntary context "
             "switches.", "",
             "| stage | run | wall ms | CPU ms | system ms | off core ms | page faults | "
             "preemptions |", "|---|---|---|---|---|---|---|---|"]
    rows = [(r, name, row) for r in (0, 1)
            for name, row in (("pipeline", piped[r]), ("one process", inproc[r]))]
    for r, name, row in [*rows, ("whole", "one process", inproc["whole"])]:
        lines.append(f"| {r} | {name} | {_compute(row):.2f} | {row['cpu']:.2f} | "
                     f"{row['sys']:.2f} | {_off(row):.2f} | {row['faults']:.1f} | "
                     f"{row['preempt']:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="vgg16", help="a tiny workload: vgg16, gnmt8, ...")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    args.git = git_sha(untracked=True)  # before the runs: the code they run
    text = _report(args, _measure(args))
    print(text)
    if args.output:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
