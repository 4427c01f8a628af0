"""What a fork server imports for the workers it will fork: each workload's slow model
imports (``Workload.imports``; torchvision for the vision workloads).

Why a module: a fork server imports a list of modules before it forks anything
(``pipedream_impl.runtime.processes``), and which imports the workers need depends on the
workloads they will build. Importing this module does those imports: for the workloads
named in ``PRELOAD_ENV`` (comma-separated; set by a process that knows its one workload
before it starts the server), else for every workload, as a suite's server needs. A name
that is no workload is left to the run to refuse.
"""

from __future__ import annotations

import importlib
import os

from core.errors import WorkloadError
from workloads import PRELOAD_ENV, registry

__all__ = ["imported"]


def _wanted() -> list:
    names = [n for n in os.environ.get(PRELOAD_ENV, "").split(",") if n]
    if not names:
        return list(registry.WORKLOADS.values())
    out = []
    for name in names:
        try:
            out.append(registry.get(name))  # its aliases too
        except WorkloadError:
            pass  # the run itself refuses it, with the list of names
    return out


imported = tuple(sorted({m for w in _wanted() for m in w.imports}))  # what was imported
for _module in imported:
    importlib.import_module(_module)
