"""The named workloads. ``get(name)`` raises a WorkloadError that lists the valid names."""

from __future__ import annotations

from core.errors import WorkloadError
from workloads.awd_lm import AWD_LM
from workloads.base import Workload
from workloads.gnmt import GNMT8, GNMT16
from workloads.gpt import GPT, GPT_LLAMA
from workloads.s2vt import S2VT
from workloads.vision import RESNET50, VGG16

__all__ = ["ALIASES", "WORKLOADS", "get"]

WORKLOADS: dict[str, Workload] = {w.name: w for w in (VGG16, RESNET50, GNMT8, GNMT16, AWD_LM,
                                                       S2VT, GPT, GPT_LLAMA)}
ALIASES = {"vgg-16": "vgg16", "resnet-50": "resnet50", "gnmt": "gnmt8", "gnmt-8": "gnmt8",
           "gnmt-16": "gnmt16", "awd_lm": "awd-lm", "awdlm": "awd-lm", "gpt2": "gpt",
           "gpt-2": "gpt", "llama": "gpt-llama", "gpt_llama": "gpt-llama"}


def get(name: str) -> Workload:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in WORKLOADS:
        raise WorkloadError(f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}")
    return WORKLOADS[key]
