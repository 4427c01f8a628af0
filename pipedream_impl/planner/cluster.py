"""``Cluster``: levels of workers and the bandwidth between them, innermost level first.

``--cluster SxG`` is S servers of G workers (two levels: G inside a server, S servers);
``--cluster 16`` is one flat level of 16 workers. ``--bandwidth`` lists bytes/s per level,
innermost first (``15.75GB/s,1.25GB/s``; units GB/s and MB/s are bytes, Gbps and Gb/s bits, or a
plain number of bytes/s). Presets, written ``A:4x4`` etc., are the PipeDream paper's clusters:

- A: 4 V100 per server over PCIe 3.0 x16 (15.75 GB/s), servers over 10 Gbps Ethernet;
- B: 8 V100 per server over NVLink (150 GB/s per direction, six 25 GB/s links; our
  figure, the paper does not give one), servers over 25 Gbps;
- C: one Titan X per server (no intra-server level), servers over 40 Gbps;
- H: a current cluster (not in the paper): 8 H100 per server on NVLink 4 (450 GB/s per
  direction per GPU), servers on a 400 Gbps fabric (50 GB/s per server link; servers with
  one 400 Gbps NIC per GPU have eight such links, not modelled by the preset).

A level of one worker (e.g. ``C:4x1``) carries no traffic and is dropped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from core.errors import UserInputError

__all__ = ["Cluster", "DEFAULT_BANDWIDTHS", "Level", "MAX_LEVEL_WORKERS", "PRESETS",
           "parse_bandwidth", "parse_cluster"]

PRESETS: dict[str, tuple[float, float]] = {  # (intra-server, inter-server) bytes/s
    "A": (15.75e9, 10e9 / 8),
    "B": (150e9, 25e9 / 8),
    "C": (15.75e9, 40e9 / 8),
    "H": (450e9, 400e9 / 8),
}
DEFAULT_BANDWIDTHS = PRESETS["A"]
# Case matters: B is bytes, b is bits.
_UNITS = {"GB/s": 1e9, "MB/s": 1e6, "KB/s": 1e3, "kB/s": 1e3, "B/s": 1.0, "GBps": 1e9,
          "Gbps": 1e9 / 8, "Gb/s": 1e9 / 8, "Gbit/s": 1e9 / 8, "Mbps": 1e6 / 8,
          "Mb/s": 1e6 / 8, "GB": 1e9, "MB": 1e6, "": 1.0}
_BANDWIDTH = re.compile(r"\s*((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([a-zA-Z/]*)\s*")
MAX_LEVEL_WORKERS = 2**15 - 1  # the planner's tables store replica counts as int16


@dataclass(frozen=True)
class Level:
    workers: int  # units of the level below in one unit of this level
    bandwidth: float  # bytes/s of one link at this level
    # bytes/s an all-reduce reaches on these links, where measured or fitted below the
    # link's (``harness.sim.calibration``); None: the link's bandwidth
    sync_bandwidth: float | None = None

    @property
    def sync_rate(self) -> float:
        """Bytes/s of one link for weight synchronisation (the planner's all-reduce)."""
        return self.bandwidth if self.sync_bandwidth is None else self.sync_bandwidth


@dataclass(frozen=True)
class Cluster:
    levels: tuple[Level, ...]
    name: str = ""

    def __post_init__(self) -> None:
        if not self.levels:
            raise UserInputError("a cluster needs at least one level")
        for i, lv in enumerate(self.levels):
            if not 1 <= lv.workers <= MAX_LEVEL_WORKERS:
                raise UserInputError(f"cluster level {i} has {lv.workers} workers; each level "
                                     f"needs 1 to {MAX_LEVEL_WORKERS} (e.g. --cluster 4x4)")
            if not (lv.bandwidth > 0 and math.isfinite(lv.bandwidth)):
                raise UserInputError(f"cluster level {i} has bandwidth {lv.bandwidth} bytes/s; "
                                     "it must be a positive finite number (e.g. "
                                     "--bandwidth 15.75GB/s,1.25GB/s)")
            if not (lv.sync_rate > 0 and math.isfinite(lv.sync_rate)):
                raise UserInputError(f"cluster level {i} has an all-reduce rate of "
                                     f"{lv.sync_rate} bytes/s; it must be a positive finite "
                                     "number")

    @property
    def workers(self) -> int:
        return math.prod(lv.workers for lv in self.levels)

    def link_level(self, a: int, b: int) -> int:
        """The level of the link between workers ``a`` and ``b``: the innermost level whose
        units hold both (0: the same server)."""
        size = 1
        for i, lv in enumerate(self.levels[:-1]):
            size *= lv.workers
            if a // size == b // size:
                return i
        return len(self.levels) - 1

    def describe(self) -> str:
        parts = " x ".join(f"{lv.workers} @ {lv.bandwidth / 1e9:g} GB/s"
                           + ("" if lv.sync_bandwidth is None else
                              f" (all-reduce at {lv.sync_bandwidth / 1e9:.3g} GB/s)")
                           for lv in self.levels)
        return f"{self.name + ': ' if self.name else ''}{parts} ({self.workers} workers)"


def parse_bandwidth(text: str, flag: str = "--bandwidth") -> float:
    """``15.75GB/s``, ``10Gbps``, ``1.25e9`` (bytes/s) -> bytes/s, positive and finite."""
    m = _BANDWIDTH.fullmatch(text)
    unit = m.group(2) if m else None
    if m is not None and unit in ("GiB", "MiB", "KiB", "TB", "TiB", "B", "KB", "kB"):
        raise UserInputError(f"{flag} {text!r} is a size, not a bandwidth; write bytes or bits "
                             "per second, e.g. 15.75GB/s, 10Gbps or 1.25e9")
    if m is None or unit not in _UNITS:
        raise UserInputError(f"cannot read {flag} {text!r}; write e.g. 15.75GB/s, 10Gbps "
                             f"or 1.25e9 (bytes/s); units: {', '.join(u for u in _UNITS if u)}")
    value = float(m.group(1)) * _UNITS[unit]
    if not (math.isfinite(value) and value > 0):
        raise UserInputError(f"{flag} {text!r}: a bandwidth must be a positive finite number "
                             "of bytes/s, e.g. 15.75GB/s")
    return value


def parse_cluster(spec: str, bandwidth: str | None = None) -> Cluster:
    """``A:4x4``, ``B:2x8``, ``C:4x1``, ``4x4``, ``16`` (+ optional ``--bandwidth``)."""
    preset = None
    shape = spec.strip()
    if ":" in shape:
        preset, shape = shape.split(":", 1)
        preset = preset.upper()
        if preset not in PRESETS:
            raise UserInputError(f"unknown cluster preset {preset!r}; choose A, B, C or H")
    m = re.fullmatch(r"(\d+)(?:x(\d+))?", shape)
    if m is None:
        raise UserInputError(f"cannot read cluster {spec!r}; write SxG (servers x workers per "
                             "server, e.g. 4x4), a flat count (16), or a preset (A:4x4)")
    servers, per_server = (int(m.group(1)), int(m.group(2))) if m.group(2) \
        else (1, int(m.group(1)))
    if servers < 1 or per_server < 1:
        raise UserInputError(f"--cluster {spec!r} has no workers: servers and workers per "
                             "server must be at least 1 (e.g. 4x4, 16 or A:4x4)")
    if servers > MAX_LEVEL_WORKERS or per_server > MAX_LEVEL_WORKERS:
        raise UserInputError(f"--cluster {spec!r} is too large: at most {MAX_LEVEL_WORKERS} "
                             "servers and workers per server")
    if bandwidth is not None:
        bws = [parse_bandwidth(b) for b in bandwidth.split(",")]
    else:
        bws = list(PRESETS[preset] if preset else DEFAULT_BANDWIDTHS)
    if m.group(2) is None and bandwidth and len(bws) == 1:
        bws = bws * 2
    if len(bws) != 2:
        raise UserInputError(f"--bandwidth needs two values (inside a server, between "
                             f"servers) for a two-level cluster, got {len(bws)}")
    levels = [Level(per_server, bws[0]), Level(servers, bws[1])]
    kept = tuple(lv for lv in levels if lv.workers > 1) or (levels[0],)
    return Cluster(kept, name=f"{preset + ':' if preset else ''}{shape}")
