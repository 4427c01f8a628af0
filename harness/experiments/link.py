"""The bandwidth between local worker processes that local plans are made with: measured.

Why: a run or a suite that plans on this machine (``pipebench run`` without ``--config``,
``compare-run``'s and ``bench``'s shared plans) gives the planner a one-level cluster of
its workers; the planner weighs each stage's activation transfer and all-reduce against its
compute with that level's bandwidth. It was an assumed 1 GB/s. Now it is this machine's
own: gloo's one-way bandwidth between two local processes (``harness.sim.microbench.
measure_link``, a 4 MiB ping-pong), measured the first time a plan needs it and kept in
``.pipebench-cache/link-<host>-<cores>cpu-torch<version>.json`` so that every later plan
on the machine uses the same number: a layout must not move between runs because a
measurement did. ``PIPEBENCH_LOCAL_BANDWIDTH`` (e.g. ``2GB/s``) overrides it; delete the
file to measure again. Measured with gloo on the CPU: on a machine whose workers are GPUs
joined by NVLink the NCCL bandwidth differs, give it with the variable.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket
import time
from pathlib import Path

from harness.paths import REPO
from pipedream_impl.planner.cluster import parse_bandwidth

__all__ = ["BANDWIDTH_ENV", "CACHE_DIR", "bandwidth_source", "local_bandwidth"]

BANDWIDTH_ENV = "PIPEBENCH_LOCAL_BANDWIDTH"
CACHE_DIR = REPO / ".pipebench-cache"


def _cache_file() -> Path:
    """This machine's file: its host name, core count and torch version (a new torch or a
    resized machine measures again)."""
    import torch

    return CACHE_DIR / (f"link-{socket.gethostname()}-{os.cpu_count()}cpu-"
                        f"torch{torch.__version__.split('+')[0]}.json")


def bandwidth_source() -> str:
    """Where ``local_bandwidth`` takes its number from, for a run's layout note."""
    if os.environ.get(BANDWIDTH_ENV, "").strip():
        return BANDWIDTH_ENV
    path = _cache_file()
    return f"measured, kept in {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"


def _read(path: Path) -> float | None:
    try:
        value = float(json.loads(path.read_text())["bandwidth_bytes_per_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if math.isfinite(value) and value > 0 else None  # a bad file: measure


def local_bandwidth() -> float:
    """Bytes/s between two local worker processes: ``PIPEBENCH_LOCAL_BANDWIDTH``, else this
    machine's cached measurement, else measured now (a few seconds) and cached. One
    process measures at a time (a file lock): two at once would disturb each other's
    ping-pong, and a second reads the first one's number."""
    given = os.environ.get(BANDWIDTH_ENV, "").strip()
    if given:
        return parse_bandwidth(given, BANDWIDTH_ENV)
    path = _cache_file()
    if (kept := _read(path)) is not None:
        return kept
    CACHE_DIR.mkdir(exist_ok=True)
    with open(CACHE_DIR / "link.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (kept := _read(path)) is not None:  # measured while this one waited
            return kept
        from harness.sim.microbench import measure_link

        latency, bandwidth = measure_link(reps=20)
        bandwidth = float(f"{bandwidth:.2g}")  # two digits: a number to plan with
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"bandwidth_bytes_per_s": bandwidth, "latency_s": latency,
                                   "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                   "how": "harness.sim.microbench.measure_link(reps=20)"}))
        tmp.replace(path)
    return bandwidth
