"""Numbers for people: counts (1.38G) and bytes (158.7 KiB), the same in every report, and
the reverse for sizes a user types (``--memory-limit 16GB``).

Sizes and bandwidths are read by different parsers on purpose: a size is bytes
(``parse_bytes`` here), a bandwidth is bytes per second (``parse_bandwidth`` in
``pipedream_impl.planner.cluster``). Each refuses the other's units with a hint, so
``--memory-limit 16GB/s`` or ``--bandwidth 16GiB`` say what went wrong.
"""

from __future__ import annotations

import math
import re

from core.errors import UserInputError

__all__ = ["SIZE_UNITS", "fmt_bytes", "fmt_count", "parse_bytes"]

# SI (GB = 10^9 bytes, as disks and the bandwidth flags count) and IEC (GiB = 2^30)
SIZE_UNITS: dict[str, float] = {"": 1.0, "B": 1.0, "KB": 1e3, "kB": 1e3, "MB": 1e6,
                                "GB": 1e9, "TB": 1e12, "KiB": 2.0**10, "MiB": 2.0**20,
                                "GiB": 2.0**30, "TiB": 2.0**40}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_SIZE = re.compile(rf"\s*({_NUMBER})\s*([A-Za-z/]*)\s*")


def fmt_count(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def fmt_bytes(n: float) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def parse_bytes(text: str, flag: str = "--memory-limit") -> float:
    """``16GB`` (10^9), ``16GiB`` (2^30), ``512MB``, ``1.5e9`` (bytes) -> bytes, > 0."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2) if m else ""
    if m is not None and ("/" in unit or unit.lower().endswith("ps")):
        raise UserInputError(f"{flag} {text!r} is a bandwidth, but {flag} is a size in bytes; "
                             "write e.g. 16GB, 16GiB or 512MB")
    if m is None or unit not in SIZE_UNITS:
        raise UserInputError(f"cannot read {flag} {text!r}; write a size in bytes such as "
                             f"16GB, 16GiB, 512MB or 1.6e10 (units: "
                             f"{', '.join(u for u in SIZE_UNITS if u)})")
    value = float(m.group(1)) * SIZE_UNITS[unit]
    if not (math.isfinite(value) and value > 0):
        raise UserInputError(f"{flag} must be a positive size (got {text!r}); e.g. 16GB")
    return value
