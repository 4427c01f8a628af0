"""Load a class named as ``module:Class``: how the registry names executors and launchers
without importing them (and torch, horovod or deepspeed) until a run starts."""

from __future__ import annotations

import importlib

__all__ = ["load"]


def load(ref: str) -> type:
    """The class ``ref`` names, e.g. ``"baselines.ddp:DDPExecutor"``."""
    module, _, name = ref.partition(":")
    if not name:
        raise ValueError(f"expected module:Class, got {ref!r}")
    return getattr(importlib.import_module(module), name)
