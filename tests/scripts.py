"""The repository's scripts/ (not a package) loaded as modules, for the tests of their parts.

Why: eight test files loaded a script by the same four importlib lines; one home now. The
module is registered in ``sys.modules`` under its name before it runs, as an import would
do (a dataclass defined in it looks its module up while being made).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["SCRIPTS", "load_script"]

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as the module ``name`` (loaded once; later calls return it)."""
    path = SCRIPTS / f"{name}.py"
    known = sys.modules.get(name)
    if known is not None and getattr(known, "__file__", None) == str(path):
        return known
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
