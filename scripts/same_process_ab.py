"""Pipeline engines on one schedule and split, in the same worker processes, epoch by epoch
in turn: a comparison the machine's drift cannot swamp.

Why: ``pipebench bench`` and ``scripts/env_ab.py`` compare runs made seconds to minutes
apart in fresh processes, while this machine's speed moves by 0.53-0.83x between rounds
(``results/machine-noise.md``); issue 24's "our pipedream-flush >= 0.95x torch-1f1b" stayed
undecided through several such runs. Here every engine named lives in the same two worker
processes (one gloo group, the same data and split, one torch thread each): they take
turns epoch by epoch, in A-B then B-A order from round to round, so adjacent epochs of
two engines see the same machine, the same allocator and the same process. What differs
is the engine alone: its schedule code, its messages, its bookkeeping.

Engines in the same processes share what a process draws at its start (where its
threads land, its allocator's state), so one launch's rounds agree with each other more
than fresh launches do: ``--launches`` repeats the whole comparison in fresh processes,
and the overall interval is taken over the launches.

Each epoch runs between two barriers of all ranks; rank 0's wall time between them,
per sample, is the engine's time: the whole epoch, pipeline fill and drain and the
epoch's close (the report, a copy of the stage's weights) included, so not ``bench``'s
steady throughput. Each rank's own figures: busy and idle time from the executor's epoch
report (its timed spans: a torch engine's gaps between compute actions count as idle,
our runtime's receives), each action kind's time, and the process's CPU time (user +
system, every thread) beside its main thread's, both read around the epoch (the rest:
gloo's and torch's threads). Rounds 0 to ``--warmup - 1`` are left out (first-epoch
allocations, caches); an even number of rounds is kept, so each engine runs first as
often as last. Per pair of engines: each round's ratio of time per sample, the geometric
mean per launch, and over the launches the geometric mean with its 95% t-interval (rounds
of one launch are not independent draws, so no test pools them; with ``--launches 1`` the
interval is over that launch's rounds, and says less than it seems to).

Settings follow ``bench``'s throughput cells (``bench.unit_sizes``): a flush pipeline runs
minibatches of M x b in M microbatches of b (M = ``MICROBATCHES_PER_STAGE`` x stages
unless given), PipeDream minibatches of b; every engine processes the same samples per
epoch. A system named
``NAME@VAR=value+VAR2=value`` is NAME built with those switches set (``SWITCHES``: the
ones read when an engine is made; torch's engines read only the optimizer's), and with
``PIPEBENCH_TRANSPORT_YIELD`` set on gloo's threads before each of its epochs (any
engine's, torch's too: it is the process's; putting them back needs root): a setting
against the default, in the same processes. Switches set in the environment apply to
every engine, the process-level ones (``PIPEBENCH_PIN``, ``PIPEBENCH_NO_HALT``) as a
worker process takes them; the report names them. The split is a straight 2-stage split balanced on
the committed profile's forward and backward times (``suites/profiles``), the same for
every engine.

Usage: ``.venv/bin/python scripts/same_process_ab.py --workload vgg16 --systems
pipedream-flush,torch-1f1b --batch-size 4 --rounds 8 --launches 4 --steps 12
-o results/same-process-ab-vgg16-b4.md``. Nothing else may run on the machine meanwhile.
The rows measured are kept beside the report (``.json``); ``--rows FILE`` renders a report
from them again without measuring.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.markdown import markdown_table as table  # noqa: E402
from harness.experiments.runner import runtime_switches  # noqa: E402
from harness.reporting.tracking import git_sha  # noqa: E402
from pipedream_impl.runtime.transport_yield import TRANSPORT_YIELD_ENV  # noqa: E402

# the switches an engine reads when it is made (``NAME@VAR=value``), and gloo's threads'
# priority, set before each of the engine's epochs (``transport_yield``)
SWITCHES = runtime_switches()[1]


def _base(name: str) -> str:
    """``system@VAR=value+...``: the system, built with those switches set (our runtime
    reads its switches, e.g. ``PIPEBENCH_RECV_AHEAD``, when an engine is made)."""
    return name.split("@", 1)[0]


def _env(name: str) -> dict[str, str]:
    """The switches of ``name`` (``NAME@VAR=value+...``); a malformed one or a variable
    that is not in ``SWITCHES`` is an error."""
    rest = name.split("@", 1)[1] if "@" in name else ""
    out = {}
    for kv in (x for x in rest.split("+") if x):
        var, eq, value = kv.partition("=")
        if not eq or var not in SWITCHES:
            raise ValueError(f"{name}: {kv!r} is not VAR=value with VAR one of "
                             f"{', '.join(SWITCHES)}")
        out[var] = value
    return out


@contextmanager
def _switched(env: dict[str, str]) -> Iterator[None]:
    """``env`` set for the block, the environment as it was after."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def _build(spec, env: dict[str, str]):  # noqa: ANN001, ANN202
    """An engine of ``spec`` made with ``env`` set."""
    import torch

    from core.imports import load
    from pipedream_impl.runtime.contract import WorkerPieces

    with _switched(env):
        return load(spec.system.executor)(WorkerPieces.build(spec, torch.device("cpu")))


def _specs(args: argparse.Namespace, rank: int, init: str) -> dict:
    """Each engine's WorkerSpec for ``rank``: bench's throughput-cell settings on a
    straight 2-stage split balanced on the committed profile."""
    from harness import systems
    from harness.config import RunConfig
    from harness.experiments.bench import unit_sizes
    from harness.experiments.pipeline_trainer import system_settings
    from pipedream_impl.planner.splits import balanced_bounds
    from pipedream_impl.profiling.profile import load_profile
    from pipedream_impl.runtime.contract import RunSettings, WorkerSpec
    from pipedream_impl.schedule.registry import MICROBATCHES_PER_STAGE
    from workloads import registry

    wl = registry.get(args.workload)
    b = args.batch_size or wl.spec("tiny").batch_size
    profile = Path(__file__).resolve().parents[1] / "suites" / "profiles" / \
        f"{args.workload}-tiny-b32-cpu.json"
    prof = load_profile(profile)
    bounds = balanced_bounds([n.forward_ms + n.backward_ms for n in prof.layers], (1, 1))
    m = args.microbatches or MICROBATCHES_PER_STAGE * 2
    out = {}
    for name in args.systems:
        micro = systems.get(_base(name)).microbatched
        batch, steps = unit_sizes(micro, m, b, args.steps)
        cfg = RunConfig.from_flags(system=_base(name), workload=args.workload, scale="tiny",
                                   batch_size=batch, microbatches=m if micro else None,
                                   threads=1, workers=2, config="1-1",
                                   max_steps_per_epoch=steps, epochs=1)
        settings, _ = system_settings(cfg, (1, 1), bounds, batch)
        run = RunSettings(workload=args.workload, scale="tiny", seed=0, batch_size=batch,
                          max_steps=steps, threads=1, warmup_steps=0)
        out[name] = WorkerSpec(rank, run, settings, init)
    return out


def _worker(rank: int, args: argparse.Namespace, init: str, q) -> None:  # noqa: ANN001
    import datetime

    import torch
    import torch.distributed as dist

    from pipedream_impl.runtime import no_halt, transport_yield
    from pipedream_impl.runtime.pinning import pin

    torch.set_num_threads(1)
    no_halt.hold()  # the process-level switches, as a worker process takes them
    pin(rank, 1, 2)  # (worker._serve), before the process group starts its threads
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    specs = _specs(args, rank, init)
    engines = {name: _build(s, _env(name)) for name, s in specs.items()}
    for rnd in range(args.rounds):
        for name in (args.systems if rnd % 2 == 0 else args.systems[::-1]):
            # gloo's threads as this engine asks (PIPEBENCH_TRANSPORT_YIELD), before the
            # barrier, so that the epoch runs under it from its start
            transport_yield.apply(_env(name).get(TRANSPORT_YIELD_ENV, transport_yield.mode()),
                                  strict=True)
            dist.barrier()
            t0, cpu0, main0 = time.perf_counter(), time.process_time(), time.thread_time()
            rep = engines[name].run_epoch(rnd)  # the same samples for every engine
            cpu, main = time.process_time() - cpu0, time.thread_time() - main0
            dist.barrier()
            wall = time.perf_counter() - t0
            samples = engines[name].n_steps * specs[name].run.batch_size
            q.put((rank, rnd, name, wall / samples, cpu / samples,
                   rep.busy_s / samples, rep.idle_s / samples,
                   {k: v / samples for k, v in rep.action_s.items()}, main / samples))
    dist.destroy_process_group()


def measure(args: argparse.Namespace) -> list[tuple]:
    """Every launch's rows: (launch, rank, round, system, wall, CPU, busy, idle, actions,
    main thread CPU), figures per sample. Each launch is a fresh pair of processes."""
    from pipedream_impl.runtime.launcher import free_port

    ctx = mp.get_context("spawn")
    out = []
    for launch in range(args.launches):
        q = ctx.Queue()
        init = f"tcp://127.0.0.1:{free_port()}"
        procs = [ctx.Process(target=_worker, args=(r, args, init, q)) for r in (0, 1)]
        for p in procs:
            p.start()
        rows, expected = [], 2 * args.rounds * len(args.systems)
        while len(rows) < expected:
            try:
                rows.append(q.get(timeout=10.0))
            except Exception:  # noqa: BLE001 - queue.Empty: is everyone still alive?
                if any(p.exitcode not in (None, 0) for p in procs):
                    for p in procs:
                        p.kill()
                    raise SystemExit("a worker failed; its error is above") from None
                continue
            if not args.quiet and len(rows) % (2 * len(args.systems)) == 0:
                print(f"launch {launch + 1}/{args.launches}: round "
                      f"{len(rows) // (2 * len(args.systems))}/{args.rounds}", flush=True)
        for p in procs:
            p.join()
        out += [(launch, *r) for r in rows]
    return out


def _interval(logs: list[float]) -> tuple[float, float, float]:
    """exp of the mean of ``logs`` and of its 95% t-interval."""
    from scipy import stats

    mean = statistics.fmean(logs)
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _pair_row(a: str, b: str, wall: dict, launches: list[int]) -> tuple:
    """a's time / b's: each launch's geometric mean over its rounds; over the launches
    (each launch one value: fresh processes differ by more than rounds of one launch do)
    the geometric mean and its 95% t-interval (over the rounds where there is one
    launch); the rounds where a was slower."""
    logs = {k: [math.log(x / y) for x, y in zip(wall[a][k], wall[b][k], strict=True)]
            for k in launches}
    each = [statistics.fmean(v) for v in logs.values()]
    every = [x for v in logs.values() for x in v]
    g, lo, hi = _interval(each if len(each) > 1 else every)
    return (f"{a} / {b}", ", ".join(f"{math.exp(x):.3f}" for x in each), f"{g:.3f}",
            f"[{lo:.3f}, {hi:.3f}]", f"{sum(x > 0 for x in every)}/{len(every)}")


def report(rows: list[tuple], args: argparse.Namespace, header: dict) -> str:
    kept = [r for r in rows if r[2] >= args.warmup]
    us = 1e6  # microseconds per sample
    per = {(r[0], r[1], r[2], r[3]): r for r in kept}
    launches = sorted({r[0] for r in kept})
    rounds = sorted({r[2] for r in kept})
    wall = {s: {k: [per[(k, 0, n, s)][4] for n in rounds] for k in launches}
            for s in args.systems}
    flat = {s: [x for v in w.values() for x in v] for s, w in wall.items()}
    lines = [f"# Same-process A/B: {', '.join(args.systems)} on {args.workload} (tiny)", "",
             f"Generated by `{header['command']}` at git {header['git']}; runtime "
             f"switches set for every engine: {header['env']}."
             + (f" Rendered again from its rows by `{header['again']}`."
                if "again" in header else ""), "",
             f"{args.launches} launch(es) of 2 worker processes x 1 torch thread, every "
             f"engine in each; {args.rounds} rounds a launch, the first {args.warmup} left "
             "out; engines in turn, in the given order, then reversed. Figures per sample, "
             "microseconds (medians over the rounds kept).", "",
             "## Time per sample (rank 0, between barriers)", ""]
    lines += table(["system", "median us/sample", "min-max"],
                   [(s, f"{us * statistics.median(w):.0f}",
                     f"{us * min(w):.0f}-{us * max(w):.0f}") for s, w in flat.items()])
    lines += ["", "## Paired by round: one system's time / another's", "",
              "Above 1: the first is slower. Per launch: the geometric mean of its rounds' "
              "ratios; overall: the geometric mean over the launches with its 95% t-interval "
              "(over the rounds where there is one launch); the rounds where the first "
              "was slower.", ""]
    lines += table(["pair", "per launch", "overall", "95% interval", "first slower"],
                   [_pair_row(a, b, wall, launches) for a, b in
                    args.pairs or [(args.systems[0], s) for s in args.systems[1:]]])
    lines += ["", "## Each rank: busy, idle, process CPU and each action kind", ""]
    kinds = sorted({k for r in kept for k in r[8]})
    body = []

    def med(rows: list[tuple], f) -> str:  # noqa: ANN001
        return f"{us * statistics.median(f(r) for r in rows):.0f}"

    for s in args.systems:
        for rank in (0, 1):
            mine = [per[(k, rank, n, s)] for k in launches for n in rounds]
            body.append((s, str(rank), med(mine, lambda r: r[6]), med(mine, lambda r: r[7]),
                         med(mine, lambda r: r[5]), med(mine, lambda r: r[9]),
                         med(mine, lambda r: r[5] - r[9]),
                         *(med(mine, lambda r, k=k: r[8].get(k, 0.0)) for k in kinds)))
    lines += table(["system", "rank", "busy", "idle", "CPU", "main thread CPU",
                    "other threads' CPU", *kinds], body)
    return "\n".join(lines) + "\n"


def _check_switches(systems: list[str]) -> None:
    """Each engine's switches parse and their values are accepted, before any worker
    starts (the readers raise on a bad value)."""
    from pipedream_impl.runtime.comm import recv_ahead, settle_sends
    from pipedream_impl.runtime.grad_buckets import bucket_mb
    from pipedream_impl.runtime.transport_yield import mode
    from workloads.recipe import fused_optimizer

    for name in systems:
        with _switched(_env(name)):
            recv_ahead(), settle_sends(), bucket_mb(), fused_optimizer(), mode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="vgg16")
    ap.add_argument("--systems", default="pipedream-flush,torch-1f1b",
                    type=lambda s: [x for x in s.split(",") if x])
    ap.add_argument("--batch-size", type=int, default=None, help="b: samples per microbatch")
    ap.add_argument("--microbatches", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=20, help="rounds per launch")
    ap.add_argument("--launches", type=int, default=3,
                    help="fresh pairs of worker processes, one after another")
    ap.add_argument("--warmup", type=int, default=2, help="first rounds left out")
    ap.add_argument("--steps", type=int, default=12, help="flush minibatches per epoch")
    ap.add_argument("--pairs", default=None, type=lambda s: [tuple(p.split("/"))
                                                             for p in s.split(",") if p],
                    help="A/B,C/D: the pairs compared (default: the first system against "
                         "each other)")
    ap.add_argument("-o", "--output", default=None,
                    help="the report (.md); the rows measured go beside it (.json)")
    ap.add_argument("--rows", default=None, help="render the report from these rows "
                    "(a run's .json) instead of measuring (--pairs may differ)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    if args.rows:  # the measured run's own settings, rows and header
        import json

        saved = json.loads(Path(args.rows).read_text())
        pairs = args.pairs or saved["args"]["pairs"]
        args = argparse.Namespace(**{**saved["args"], "output": args.output,
                                     "quiet": args.quiet, "pairs": pairs})
        for pair in pairs or []:
            if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(args.systems):
                ap.error(f"--pairs: {'/'.join(pair)} is not two of the run's systems")
        rows = [tuple(r) for r in saved["rows"]]
        header = {**saved["header"], "again": ".venv/bin/python scripts/same_process_ab.py "
                  + " ".join(sys.argv[1:])}
        text = report(rows, args, header)
    else:
        kept = args.rounds - args.warmup
        if len(set(args.systems)) != len(args.systems) or len(args.systems) < 2 or \
                kept < 4 or kept % 2 or args.launches < 1:
            ap.error("give two distinct systems or more, an even number of rounds past "
                     "--warmup (4 or more), and a launch")
        for pair in args.pairs or []:
            if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(args.systems):
                ap.error(f"--pairs: {'/'.join(pair)} is not two of --systems")
        try:
            _check_switches(args.systems)
        except ValueError as e:
            ap.error(str(e))
        from harness.experiments.runner import runtime_env

        header = {"command": ".venv/bin/python scripts/same_process_ab.py "
                  + " ".join(sys.argv[1:]),
                  "git": git_sha(), "env": runtime_env()}
        rows = measure(args)
        if args.output:  # kept before the report: a measurement is not lost to it
            import json

            keep = {k: v for k, v in vars(args).items() if k not in ("output", "quiet", "rows")}
            Path(args.output).with_suffix(".json").write_text(json.dumps(
                {"args": keep, "header": header, "rows": rows}))
        text = report(rows, args, header)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    if not args.quiet or not args.output:
        print(text)


if __name__ == "__main__":
    main()
