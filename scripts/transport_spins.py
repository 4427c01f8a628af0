"""How often gloo's transport threads wake for nothing, under each runtime setting: the
receives-ahead gap of issue 24, counted in system calls.

Why: on tiny VGG-16 at microbatches of 4, pipedream-flush with its receives posted ahead
(the default) spends several times the CPU per sample in threads other than the workers'
main threads, and runs slower than with each receive posted when due
(``results/same-process-ab-vgg16-b4.md``). The CPU is gloo's transport threads'
(``gloo_tcp_loop``), and their profile is ``epoll_wait`` and little else. This script
counts what they do, from the kernel's system-call tracepoints (``perf record -a``),
during one ``pipebench bench`` run of a system per setting:
- ``epoll_wait`` returns with an event, and socket reads (``recvfrom`` calls; gloo reads
  until a call finds nothing, so each wake-up that reads makes at least two, and one that
  drains several messages more): a thread that wakes many times per read is spinning;
- spins: runs of ``MIN_SPIN`` or more event returns in a row with neither a read nor a
  write of the thread's own between, their number, their time summed and their median
  length (a return of -1, an interrupted wait, is neither an event nor a timeout);
- how many spins began within ``NEAR_S`` after the same process's main thread wrote to a
  socket (``writev``): gloo's handler takes the connection's mutex with a try-lock and
  returns when the main thread holds it (posting a receive, writing a send), so that the
  level-triggered epoll wakes it again at once, for as long as the main thread holds it.

The per-process counts are summed over the run's worker processes (every process whose
transport thread appears). The bench's own figures are not used: the tracepoints cost
time. Needs ``perf`` and the right to trace the whole machine (root). Nothing else may run
on the machine meanwhile.

Usage: ``.venv/bin/python scripts/transport_spins.py --setting PIPEBENCH_RECV_AHEAD=1
--setting PIPEBENCH_RECV_AHEAD=0 --setting PIPEBENCH_TRANSPORT_YIELD=nice
-o results/transport-spins-vgg16-b4.md -- --workload vgg16 --systems pipedream-flush
--batch-size 4 --steps 12 --epochs 3``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.markdown import markdown_table as table  # noqa: E402
from harness.reporting.tracking import git_sha  # noqa: E402
from pipedream_impl.runtime.transport_yield import THREAD_NAME  # noqa: E402

EVENTS = ("syscalls:sys_exit_epoll_wait", "syscalls:sys_enter_recvfrom",
          "syscalls:sys_enter_writev")
MIN_SPIN = 5  # event returns in a row without a read
NEAR_S = 2e-4  # a spin "follows" a main-thread write that came at most this long before
COLUMNS = ["setting", "processes", "epoll events", "epoll timeouts", "socket reads",
           "events per read", "spins", "spin s", "median spin ms",
           "spins after a main-thread write"]


def _trace(setting: str, bench_args: list[str], data: Path) -> None:
    var, _, value = setting.partition("=")
    env = {**os.environ, var: value, "PIPEBENCH_TRACKING": "off"}
    out = data.with_suffix(".json")
    cmd = ["perf", "record", "-q", "-a", *[a for e in EVENTS for a in ("-e", e)], "-o",
           str(data), "--", str(ROOT / ".venv/bin/pipebench"), "bench", *bench_args,
           "--repeats", "1", "--json", str(out), "-o", str(out.with_suffix(".md")), "--quiet"]
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def _events(data: Path) -> list[tuple[str, int, int, float, str, str]]:
    """(comm, pid, tid, time, event, last field) of each traced call."""
    text = subprocess.run(["perf", "script", "-i", str(data), "-F",
                           "comm,pid,tid,time,event,trace"], check=True,
                          capture_output=True, text=True).stdout
    out = []
    for line in text.splitlines():
        head, _, rest = line.partition(": ")  # "comm pid/tid time" ": " "event: trace"
        parts = head.split()
        if len(parts) < 3 or "/" not in parts[-2]:
            continue
        pid, tid = map(int, parts[-2].split("/"))
        event, _, trace = rest.strip().partition(": ")  # "syscalls:sys_exit_...: 0x1"
        out.append((" ".join(parts[:-2]), pid, tid, float(parts[-1]), event.rstrip(":"),
                    trace.split()[-1] if trace.split() else ""))
    return out


def spins(events: list[tuple]) -> dict[str, float]:
    """The figures of one run's calls (``_events``' tuples, in time order)."""
    loops = {pid for comm, pid, _, _, _, _ in events if comm == THREAD_NAME}
    writes: dict[int, float] = {}  # each process's main thread's latest writev
    run: dict[int, list] = {}  # each loop thread's run of event returns: start, end, n, after
    done: list[tuple[float, bool]] = []
    n_ev = n_to = n_read = 0

    def close(tid: int) -> None:
        r = run.pop(tid, None)
        if r and r[2] >= MIN_SPIN:
            done.append((r[1] - r[0], r[3]))

    for comm, pid, tid, t, ev, last in events:
        if pid not in loops:
            continue
        if comm != THREAD_NAME:
            if tid == pid and ev.endswith("writev"):
                writes[pid] = t
            continue
        if ev.endswith("epoll_wait") and last.startswith("0xffff"):  # -1: interrupted
            continue
        if ev.endswith("epoll_wait") and last not in ("0x0", "0"):
            n_ev += 1
            r = run.setdefault(tid, [t, t, 0, t - writes.get(pid, -1.0) <= NEAR_S])
            r[1], r[2] = t, r[2] + 1
        elif ev.endswith("epoll_wait"):
            n_to += 1
            close(tid)
        elif ev.endswith("recvfrom"):
            n_read += 1
            close(tid)
        elif ev.endswith("writev"):  # its own write of a queued send: work, not a spin
            close(tid)
    for tid in list(run):
        close(tid)
    lengths = [d for d, _ in done]
    return {"processes": len(loops), "epoll events": n_ev, "epoll timeouts": n_to,
            "socket reads": n_read, "events per read": n_ev / max(1, n_read),
            "spins": len(done), "spin s": sum(lengths),
            "median spin ms": 1e3 * statistics.median(lengths) if lengths else 0.0,
            "spins after a main-thread write": sum(after for _, after in done)}


def render(rows: dict[str, dict[str, float]], command: str) -> str:
    fmt = {"events per read": "{:.1f}", "spin s": "{:.3f}", "median spin ms": "{:.2f}"}
    body = [[setting] + [fmt.get(c, "{:.0f}").format(r[c]) for c in COLUMNS[1:]]
            for setting, r in rows.items()]
    return "\n".join([
        "# gloo's transport threads: wake-ups per socket read, by setting", "",
        f"Generated by `{command}` at git {git_sha()}; one `pipebench bench --repeats 1` "
        f"per setting under `perf record -a` of {', '.join(f'`{e}`' for e in EVENTS)}.", "",
        f"Per run, summed over its worker processes' `{THREAD_NAME}` threads: `epoll_wait` "
        "returns with an event and without (its 10 ms tick), socket reads (`recvfrom` calls: "
        "each wake-up that reads ends with one that finds nothing), spins "
        f"({MIN_SPIN} or more event returns in a row with no read or write of the thread's "
        "own between), their "
        "time summed, their median length, and how many began within "
        f"{NEAR_S * 1e3:.1f} ms after the same process's main thread wrote to a socket "
        "(`writev`: gloo's handler returns at once while another thread holds the "
        "connection's mutex, and the level-triggered epoll wakes it again). "
        "Why: `scripts/transport_spins.py`'s docstring.", "",
        *table(COLUMNS, body), ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", action="append", required=True,
                    help="VAR=value, one run each (e.g. PIPEBENCH_RECV_AHEAD=0)")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("bench_args", nargs=argparse.REMAINDER,
                    help="after --: pipebench bench's arguments")
    args = ap.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    for s in args.setting:
        if "=" not in s:
            ap.error(f"--setting {s!r}: give VAR=value")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, s in enumerate(args.setting):
            data = Path(tmp) / f"run{i}.data"
            print(f"transport_spins: {s}", file=sys.stderr, flush=True)
            _trace(s, bench_args, data)
            rows[s] = spins(_events(data))
    command = ".venv/bin/python scripts/transport_spins.py " + shlex.join(
        [a for s in args.setting for a in ("--setting", s)] + ["-o", str(args.output), "--",
                                                                *bench_args])
    args.output.write_text(render(rows, command))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
