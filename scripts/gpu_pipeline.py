"""What the pipeline runtime adds per action, on one device: the whole model under the plain
trainer against the runtime's own handlers with 1, 2 and 4 stages in one process.

Why (issue 24): a pipeline's time per minibatch is its stages' compute plus what the
runtime does around each action (Python dispatch, autograd set-up on received tensors, the
copies of messages, stash bookkeeping, and on a GPU the timing of each action: a wait for
the device after every action until device-event clocks replaced it). Run in one process
on one device (``pipedream_impl.runtime.local``: every stage in turn, messages handed over
as device copies, no transfer and no waiting), the pipeline does the same arithmetic as the trainer,
so its extra time per minibatch, over the actions it takes, is the runtime's cost per
action, comparable between a GPU at full scale and the CPU at tiny scale.

Measured per workload (after one warm-up epoch, over ``--epochs`` epochs of ``--steps``
minibatches, wall clock with the device synchronised at the epoch's end; closing an epoch,
which copies each stage's weights to the host for its report, is timed apart):
- ``trainer``: ``harness.experiments.training``'s steps on the whole model, two ways:
  reading each step's loss, which waits for the device, as the ``single`` system does
  (``per step``), and the same steps with every loss read once at the epoch's end
  (``per epoch``, as the pipeline runs: nothing waits for the device within an epoch).
  Each way runs twice, before the pipelines (per step, then per epoch: the first run
  meets a device that has just started working) and after them (per epoch, then per
  step), so that a device warming up and the per-step wait are told apart. ``added per
  action`` is against the mean of the two per-epoch runs;
- ``S stages``: the runtime's handlers on S balanced stages (layer times profiled on the
  device, ``balanced_bounds``), once as the runtime runs (on a GPU its actions timed by
  device events, ``pipedream_impl.runtime.device_clock``) and once waiting for the device
  after every action to time it on the host clock (the runtime's way before), ``--rounds``
  times each way, the ways alternating which goes first (median ms per minibatch); and,
  as the runtime runs, each action kind's time per minibatch from the runtime's own report
  and every action's span summed (mean over the rounds);
- with ``--trace-dir``: a ``torch.profiler`` trace (Chrome format, gzipped) of one epoch
  of the run with ``--trace-stages`` stages (its close not included), and its top
  operators by self device / CPU time.

    python3 scripts/gpu_pipeline.py --device cuda --scale full -o results/gpu/pipeline-h100.md
    python3 scripts/gpu_pipeline.py --device cpu --scale tiny --threads 1 -o ...

Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.experiments.training import minibatches, step_loss, train_step  # noqa: E402
from pipedream_impl.planner.splits import balanced_bounds  # noqa: E402
from pipedream_impl.profiling.profiler import profile_workload  # noqa: E402
from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec  # noqa: E402
from pipedream_impl.runtime.local import local_executors, play_epoch, run_local  # noqa: E402
from workloads import registry  # noqa: E402
from workloads.recipe import load_splits, make_optimizer  # noqa: E402

KINDS = ("F", "B", "U", "SF", "SB", "RF", "RB")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


TRAINER_WAYS = (("per step", True), ("per epoch", False))  # the loss read each step or not


def _trainer_ms(name: str, scale: str, device: torch.device, args,  # noqa: ANN001
                read_each: bool) -> float:
    """Plain training steps on the whole model: ms per minibatch. ``read_each``: each
    step's loss is read as it comes (``train_step``), else left on the device
    (``step_loss``, the same step) and read once the epoch is over."""
    wl = registry.get(name)
    spec = wl.spec(scale)
    splits = load_splits(wl, scale, None, 0)
    model = wl.build(scale, {**splits.train.meta, "init_seed": 0}).to(device).train()
    opt = make_optimizer(spec, model.parameters())
    total, n = 0.0, 0
    for epoch in range(1 + args.epochs):
        _sync(device)
        t0 = time.perf_counter()
        k = 0
        losses = []
        for batch in minibatches(splits.train, wl, spec.batch_size, 0, epoch, args.steps):
            if read_each:
                train_step(model, wl, spec, opt, batch.to(device))
            else:
                losses.append(step_loss(model, wl, spec, opt, batch.to(device)))
            k += 1
        _ = [float(x) for x in losses]  # the reads the per-step way made, at the end
        _sync(device)
        if epoch:  # the first epoch warms up
            total, n = total + time.perf_counter() - t0, n + k
    return 1e3 * total / n


def _layer_ms(name: str, scale: str, device: torch.device) -> list[float]:
    """Each layer's forward + backward ms on the device (what the stages are balanced on)."""
    wl = registry.get(name)
    prof = profile_workload(wl, scale, wl.spec(scale).batch_size, device)
    return [n.forward_ms + n.backward_ms for n in prof.layers]


def _epochs(executors, device: torch.device, epochs: int, wait_each: bool) -> tuple:  # noqa: ANN001
    """ms per minibatch of the epochs' actions over ``epochs`` epochs after a warm-up one,
    ms per minibatch of closing them (each rank's report takes a host copy of its stage's
    weights), and the reports. ``wait_each``: time every action on the host clock after
    waiting for the device (the runtime's way before device-event clocks; on the CPU the
    two are the same)."""
    if wait_each:
        for ex in executors:
            ex.device_clock = False
    try:
        run_local(executors, 0)
        wall, close, reports = 0.0, 0.0, []
        for e in range(1, 1 + epochs):
            _sync(device)
            t0 = time.perf_counter()
            play_epoch(executors, e)
            _sync(device)
            t1 = time.perf_counter()
            reports.append([ex.finish_epoch() for ex in executors])
            wall, close = wall + t1 - t0, close + time.perf_counter() - t1
    finally:
        for ex in executors:
            vars(ex).pop("device_clock", None)
    n = epochs * executors[0].n_steps
    return 1e3 * wall / n, 1e3 * close / n, reports


def _pipeline(name: str, scale: str, device: torch.device, bounds: tuple, args) -> dict:  # noqa: ANN001
    stages = len(bounds)
    b = registry.get(name).spec(scale).batch_size
    spec = WorkerSpec(0, RunSettings(name, scale, 0, b, max_steps=args.steps, timeout_s=600.0,
                                     threads=args.threads, device=device.type),
                      SystemSettings((1,) * stages, bounds))
    executors = local_executors(spec, device)
    runs: dict[bool, list] = {True: [], False: []}  # waiting per action or not: rounds
    for r in range(args.rounds):  # the two ways alternate which goes first
        for wait in ((True, False) if r % 2 == 0 else (False, True)):
            runs[wait].append(_epochs(executors, device, args.epochs, wait))
    synced = statistics.median(ms for ms, _, _ in runs[True])
    free = statistics.median(ms for ms, _, _ in runs[False])
    close = statistics.median(c for _, c, _ in runs[False])
    waited = [rep for _, _, reps in runs[True] for rep in reps]
    reports = [rep for _, _, reps in runs[False] for rep in reps]
    n = len(reports) * executors[0].n_steps
    kinds = {k: 1e3 * sum(rep[r].action_s.get(k, 0.0) for rep in reports
                          for r in range(stages)) / n for k in KINDS}
    actions = sum(len(ex.schedule().actions[ex.spec.rank]) for ex in executors)
    out = {"stages": stages, "bounds": bounds, "synced": synced, "free": free, "close": close,
           "kinds": kinds, "booked": (_booked(waited, n), _booked(reports, n)),
           "rounds": (runs[True], runs[False]),
           "actions": actions / executors[0].n_steps}
    if args.trace_dir and stages == args.trace_stages:
        out["trace"] = _trace(executors, device, Path(args.trace_dir), name)
    return out


def _booked(reports: list, n: int) -> float:
    """ms per minibatch of every action's span summed over the stages: in one process the
    stages run in turn, so the spans should fill the epoch's wall time when timed on the
    host, and add up to the device's busy time when read off device events."""
    return 1e3 * sum(sum(r.action_s.values()) for rep in reports for r in rep) / n


def _trace(executors, device: torch.device, where: Path, name: str) -> dict:  # noqa: ANN001
    """One epoch's actions under torch.profiler (its close, the weights' host copy, not)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        play_epoch(executors, 99)
        _sync(device)
        wall = time.perf_counter() - t0
    for ex in executors:
        ex.finish_epoch()
    where.mkdir(parents=True, exist_ok=True)
    raw = where / f"trace-{name}-{len(executors)}stage-{device.type}.json"
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    avg = prof.key_averages()
    # the kernels' and copies' own rows only (an operator's row repeats its kernels' time)
    dev = sum(e.self_device_time_total for e in prof.events()
              if e.device_type == DeviceType.CUDA) / 1e6
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return {"file": f"{raw.name}.gz", "wall_s": wall, "device_busy_s": dev,
            "table": avg.table(sort_by=key, row_limit=15, max_name_column_width=48)}


def _trainers(name: str, device: torch.device, args, ways) -> list:  # noqa: ANN001
    """(way, ms per minibatch) of the trainer run each of ``ways`` in turn."""
    out = []
    for way, read_each in ways:
        print(f"{name}: trainer, loss read {way}", file=sys.stderr, flush=True)
        out.append((way, _trainer_ms(name, args.scale, device, args, read_each)))
    return out


def _trainer_base(runs: list) -> float:
    """The trainer's ms per minibatch the pipelines are held against: its per-epoch runs'
    mean (the pipeline reads no loss within an epoch either)."""
    return statistics.mean(ms for way, ms in runs if way == "per epoch")


def _trainer_rows(name: str, runs: list) -> list[str]:
    return [f"| {name} | trainer, loss read {way} | whole | | {ms:.2f} | | | | |"
            + " |" * len(KINDS) for way, ms in runs]


def _report(rows: dict, args, device_name: str) -> str:  # noqa: ANN001
    lines = [f"# The pipeline runtime's cost per action on {device_name}", "",
             f"Generated by `python3 {' '.join(sys.argv)}` ({time.strftime('%Y-%m-%d')}; torch "
             f"{torch.__version__}, {args.threads} CPU thread(s)). One process: every stage "
             f"in turn on the one device, {args.epochs} epochs of {args.steps} minibatches "
             f"after a warm-up epoch, each pipeline {args.rounds} time(s) each way, the "
             "ways alternating which goes first (the time columns are medians, every round "
             "below the table; the kinds and `booked` are means over the rounds). "
             "Trainer rows in the order they ran: two before the pipelines, two after. "
             "`added per action`: (the pipeline's ms per minibatch "
             "as the runtime runs - the trainer's with the loss read per epoch, the mean of "
             "its two runs) / actions per minibatch; "
             "the epoch's close (a host copy of each stage's weights for its report) is "
             "not in either, and is shown apart. Action kinds: ms per minibatch summed over "
             "the stages, as the runtime runs. `booked`: every action's span summed over the "
             "stages, ms per minibatch, waiting per action / as the runtime runs (a check of "
             "the clocks: in one process the host-timed spans fill the wall time, the "
             "device-timed ones the device's busy time). On the CPU the two columns run "
             "the same code (there is no device to wait for).",
             "", "| workload | run | split | ms/minibatch, waiting per action | ms/minibatch, "
             "as the runtime runs | epoch close, ms/minibatch | actions/minibatch | "
             "added per action, µs | booked, ms | "
             + " | ".join(f"{k} ms" for k in KINDS) + " |",
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(KINDS)]
    for name, got in rows.items():
        t = _trainer_base(got["before"] + got["after"])
        lines += _trainer_rows(name, got["before"])
        for p in got["pipes"]:
            added = 1e3 * (p["free"] - t) / p["actions"]
            kinds = " | ".join(f"{p['kinds'][k]:.2f}" for k in KINDS)
            lines.append(f"| {name} | {p['stages']} stage(s) | {list(p['bounds'])} | "
                         f"{p['synced']:.2f} | {p['free']:.2f} | {p['close']:.2f} | "
                         f"{p['actions']:.0f} | "
                         f"{added:.0f} | {p['booked'][0]:.2f} / {p['booked'][1]:.2f} | "
                         f"{kinds} |")
        lines += _trainer_rows(name, got["after"])
    lines += ["", "Rounds, ms per minibatch waiting per action / as the runtime runs:", ""]
    for name, got in rows.items():
        for p in got["pipes"]:
            pairs = zip(*([ms for ms, _, _ in way] for way in p["rounds"]), strict=True)
            lines.append(f"- {name}, {p['stages']} stage(s): "
                         + ", ".join(f"{a:.2f} / {b:.2f}" for a, b in pairs))
    for name, got in rows.items():
        for p in got["pipes"]:
            if "trace" in p:
                tr = p["trace"]
                lines += ["", f"## {name}, {p['stages']} stage(s), one epoch under torch.profiler "
                          f"(`{tr['file']}`)", "",
                          f"Wall {tr['wall_s']:.3f} s; device kernels (self time summed) "
                          f"{tr['device_busy_s']:.3f} s.", "", "```", tr["table"], "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--workloads", default="vgg16,resnet50")
    ap.add_argument("--stages", default="1,2,4")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1,
                    help="times each pipeline is run both ways, alternating which goes first "
                         "(medians reported)")
    ap.add_argument("--trace-dir", default=None)
    ap.add_argument("--trace-stages", type=int, default=2,
                    help="the stage count whose run is traced")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    if args.trace_dir and str(args.trace_stages) not in args.stages.split(","):
        ap.error(f"--trace-stages {args.trace_stages}: not one of --stages {args.stages}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"the CPU ({args.threads} thread(s))")
    rows = {}
    for name in args.workloads.split(","):
        got = {"before": _trainers(name, device, args, TRAINER_WAYS), "pipes": []}
        layer_ms = _layer_ms(name, args.scale, device)  # one profile for every split
        for s in map(int, args.stages.split(",")):
            print(f"{name}: {s} stage(s)", file=sys.stderr, flush=True)
            bounds = balanced_bounds(layer_ms, (1,) * s)
            got["pipes"].append(_pipeline(name, args.scale, device, bounds, args))
            if device.type == "cuda":
                torch.cuda.empty_cache()
        got["after"] = _trainers(name, device, args, TRAINER_WAYS[::-1])
        rows[name] = got
    text = _report(rows, args, device_name)
    Path(args.output).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
