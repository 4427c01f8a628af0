"""Is compute slower right after a worker slept than after it kept its CPU busy?

Why: on this machine a pipeline's forwards and backwards run longer inside the run than
the same actions measured alone in one process (``reproduce validation``'s "compute in
the run / alone"), while two processes computing at once without waiting lose nothing;
a forward that follows a receive that blocked was measured slower than one that did not
wait (issue 24). One suspect is the CPU itself: a virtual CPU whose only thread
sleeps halts (this VM's cpuidle driver is ``haltpoll`` with its polling at 0 ns), and
the compute after the wake-up may start cold. This script isolates that, running none of
our code: two processes, one core each, take turns as the stages of a pipeline do; each
computes a fixed torch loop (about a microbatch's forward), hands a token to the other
over a pipe and waits for it back. The wait is

- ``block``: a blocking read (the process sleeps, as in gloo's wait);
- ``spin``: polling the pipe, yielding the core between polls (the CPU never idles);
- ``block+idle-spinner``: a blocking read while a ``SCHED_IDLE`` process per core spins
  (it runs only when nothing else wants the core, so the CPU never halts; no root needed);
- ``block+dma0``: a blocking read while ``/dev/cpu_dma_latency`` is held at 0 (the
  kernel's cpuidle may then only poll; root only, skipped elsewhere; the request made as
  ``PIPEBENCH_NO_HALT`` makes it, ``no_halt.request``, the timed loop still none of ours);

and ``alone`` is the same loop back to back in one process, no waits. Each mode runs once
per round, the modes interleaved; the report gives each mode's median compute time per
round, its ratio to ``alone`` and to ``block`` in the same round, and the CPUs' halts
per second (cpuidle's non-polling states) during the mode's turns.

Usage: ``.venv/bin/python scripts/wake_cost.py [--rounds 5] [--reps 400] [-o
results/wake-cost.md]``. Nothing else may run on the machine meanwhile; needs 2 cores.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.markdown import markdown_table, write_report  # noqa: E402
from pipedream_impl.runtime import no_halt  # noqa: E402

MODES = ("alone", "block", "spin", "block+idle-spinner", "block+dma0")
WARM = 50  # calls of the loop in each process before its first timed turn
_CPUIDLE = Path("/sys/devices/system/cpu")


def _loop():  # noqa: ANN202 - the fixed compute: 8 products of 192 x 192 (about 1 ms)
    import torch

    torch.set_num_threads(1)
    a = torch.randn(192, 192)

    def once() -> float:
        t0 = time.perf_counter()
        for _ in range(8):
            a @ a
        return time.perf_counter() - t0
    for _ in range(WARM):
        once()
    return once


def _ready(core: int, ready, go):  # noqa: ANN001, ANN202
    """On ``core``, the loop warmed up; then wait until the parent says go (so that the
    halts are counted over the turns alone, not over start-up)."""
    os.sched_setaffinity(0, {core})
    once = _loop()
    ready.put(core)
    go.wait()
    return once


def _side(core: int, rd, wr, spin: bool, reps: int, out, first: bool,  # noqa: ANN001
          ready, go) -> None:  # noqa: ANN001
    """One of the two: wait for the token on ``rd``, compute, pass it on ``wr``."""
    once, times = _ready(core, ready, go), []
    if first:
        wr.send_bytes(b"x")
    for _ in range(reps):
        if spin:
            while not rd.poll(0):
                os.sched_yield()
        rd.recv_bytes()
        times.append(once())
        wr.send_bytes(b"x")
    out.put(times)


def _alone(core: int, reps: int, out, ready, go) -> None:  # noqa: ANN001
    once = _ready(core, ready, go)
    out.put([once() for _ in range(reps)])


def _idle_spin(core: int) -> None:
    os.sched_setaffinity(0, {core})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while True:
        pass


def halts(root: Path = _CPUIDLE) -> int:
    """Entries into the CPUs' non-polling idle states so far (``root``: sysfs' cpu tree)."""
    n = 0
    for state in root.glob("cpu[0-9]*/cpuidle/state*"):
        if (state / "name").read_text().strip() != "POLL":
            n += int((state / "usage").read_text())
    return n


def _run(mode: str, reps: int) -> tuple[float, float] | None:
    """(median ms of the loop over both processes' turns, halts per second over the turns)
    or None where the mode cannot run here. The two processes take the first two cores
    this one may use."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    ctx = mp.get_context("spawn")
    q, ready, go, extra, dma = ctx.Queue(), ctx.Queue(), ctx.Event(), [], None
    if mode == "block+dma0":
        try:
            dma = no_halt.request()  # held for this mode's run only
        except OSError:
            return None
    if mode == "block+idle-spinner":
        extra = [ctx.Process(target=_idle_spin, args=(c,), daemon=True) for c in cores]
    pipes = []
    if mode == "alone":
        procs = [ctx.Process(target=_alone, args=(cores[0], reps, q, ready, go), daemon=True)]
    else:
        r1, w1 = ctx.Pipe(duplex=False)
        r2, w2 = ctx.Pipe(duplex=False)
        pipes = [r1, w1, r2, w2]
        spin = mode == "spin"
        procs = [ctx.Process(target=_side, daemon=True,
                             args=(cores[0], r1, w2, spin, reps, q, False, ready, go)),
                 ctx.Process(target=_side, daemon=True,
                             args=(cores[1], r2, w1, spin, reps, q, True, ready, go))]
    try:
        for p in extra + procs:
            p.start()
        for conn in pipes:  # the children hold their ends: one that dies ends the other's
            conn.close()
        for _ in procs:
            ready.get(timeout=300)
        h0, t0 = halts(), time.monotonic()
        go.set()
        times = [t for _ in procs for t in q.get(timeout=300)]
        rate = (halts() - h0) / (time.monotonic() - t0)
    finally:
        for p in extra + procs:
            if p.is_alive():
                p.kill()
            p.join()
        if dma is not None:
            dma.close()
    return 1e3 * statistics.median(times), rate


def table(got: dict[str, list[tuple[float, float]]]) -> list[tuple[str, ...]]:
    """The report's rows from each mode's (ms, halts/s) per round: the times, the median
    and range of each round's time over ``alone``'s and over ``block``'s in the same round
    (paired: the machine's drift between rounds cancels), the median halts."""
    def against(ms: list[float], ref: str) -> str:
        ratio = [x / r for x, (r, _) in zip(ms, got[ref], strict=True)]
        return f"{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"
    rows = []
    for mode in got:
        if not got[mode]:
            rows.append((mode, "not run (no permission)", "-", "-", "-"))
            continue
        ms = [x for x, _ in got[mode]]
        rows.append((mode, " ".join(f"{x:.3f}" for x in ms), against(ms, "alone"),
                     against(ms, "block") if got.get("block") else "-",
                     f"{statistics.median(h for _, h in got[mode]):.0f}"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=400, help="turns of each process per run")
    ap.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("wake_cost.py needs two cores it may use")
    got: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            res = _run(mode, args.reps)
            if res is not None:
                got[mode].append(res)
                print(f"round {r + 1}: {mode}: {res[0]:.3f} ms, {res[1]:.0f} halts/s",
                      file=sys.stderr, flush=True)
    rows = table(got)
    driver = (_CPUIDLE / "cpuidle" / "current_driver")
    poll = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    text = "\n".join([
        "# Compute right after a wait: sleeping against keeping the CPU busy", "",
        f"Generated by `python scripts/wake_cost.py {' '.join(sys.argv[1:])}` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} CPUs; cpuidle driver "
        f"{driver.read_text().strip() if driver.exists() else 'unknown'}, guest halt "
        f"polling {poll.read_text().strip() + ' ns' if poll.exists() else 'unknown'}. "
        f"{args.rounds} rounds, the modes interleaved; each run {args.reps} turns of each "
        "process. The modes are described in the script's docstring.", "",
        *markdown_table(("mode", "median loop time per round (ms)",
                         "over alone, same round: median (range)",
                         "over block, same round: median (range)", "halts/s (median)"),
                        rows), ""])
    write_report(text, args.output, "wake_cost.py")


if __name__ == "__main__":
    main()
