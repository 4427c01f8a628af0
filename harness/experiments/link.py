"""The bandwidth between local worker processes that local plans are made with: measured.

Why: a run or a suite that plans on this machine (``pipebench run`` without ``--config``,
``compare-run``'s and ``bench``'s shared plans) gives the planner a one-level cluster of
its workers; the planner weighs each stage's activation transfer and all-reduce against its
compute with that level's bandwidth. It was an assumed 1 GB/s. Now it is this machine's
own: gloo's one-way bandwidth between two local processes (``harness.sim.microbench.
measure_link``, a 4 MiB ping-pong), measured the first time a plan needs it and kept in
``.pipebench-cache/link-<host>.json`` so that every later plan on the machine (every
night of a suite) uses the same number: a layout must not move between runs because a
measurement did. ``PIPEBENCH_LOCAL_BANDWIDTH`` (e.g. ``2GB/s``) overrides it; delete the
file to measure again. Measured with gloo on the CPU: on a machine whose workers are GPUs
joined by NVLink the NCCL bandwidth differs, give it with the variable.
"""

from __future__ import annotations

import json
import os
import socket
import time

from harness.paths import REPO
from pipedream_impl.planner.cluster import parse_bandwidth

__all__ = ["BANDWIDTH_ENV", "CACHE_DIR", "local_bandwidth"]

BANDWIDTH_ENV = "PIPEBENCH_LOCAL_BANDWIDTH"
CACHE_DIR = REPO / ".pipebench-cache"


def _cache_file():  # noqa: ANN202 - a Path
    return CACHE_DIR / f"link-{socket.gethostname()}.json"


def local_bandwidth() -> float:
    """Bytes/s between two local worker processes: ``PIPEBENCH_LOCAL_BANDWIDTH``, else this
    machine's cached measurement, else measured now (a few seconds) and cached."""
    given = os.environ.get(BANDWIDTH_ENV, "").strip()
    if given:
        return parse_bandwidth(given, BANDWIDTH_ENV)
    path = _cache_file()
    try:
        return float(json.loads(path.read_text())["bandwidth_bytes_per_s"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from harness.sim.microbench import measure_link

    latency, bandwidth = measure_link(reps=20)
    bandwidth = float(f"{bandwidth:.2g}")  # two digits: a number to plan with, not a result
    CACHE_DIR.mkdir(exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # atomic: test workers may race
    tmp.write_text(json.dumps({"bandwidth_bytes_per_s": bandwidth, "latency_s": latency,
                               "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
                               "how": "harness.sim.microbench.measure_link(reps=20)"}))
    tmp.replace(path)
    return bandwidth
