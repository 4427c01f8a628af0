"""On/off environment switches, read by one rule.

Why: the runtime and the training recipe each have switches for measuring what a feature
is worth (``PIPEBENCH_SETTLE_SENDS``, ``PIPEBENCH_FUSED_OPTIMIZER``, ...), set per run with
``scripts/env_ab.py``. A typo must not silently fall back to a default, and a lower layer
(``workloads``) must read its switch the same way as the runtime, so the rule lives here.
"""

from __future__ import annotations

import os

__all__ = ["switch"]


def switch(name: str, default: str, on: str, off: str) -> bool:
    """Whether the environment switch ``name`` is on: ``1`` or ``0``, ``default`` when
    unset; anything else is an error naming what each value does (``on``, ``off``), not a
    silent default."""
    value = os.environ.get(name, default)
    if value not in ("0", "1"):
        raise ValueError(f"{name}={value!r}: use 1 ({on}) or 0 ({off})")
    return value == "1"
