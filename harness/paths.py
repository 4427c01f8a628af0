"""Where the repository and its results folder are: the default MLflow store and the cached
CPU profiles live under results/ (no torch or mlflow imported here).

``REPO`` is the checkout whose code runs, wherever the command was started. With the
project installed in editable mode, a second checkout of it (a ``git worktree`` of an older
commit, say) shares the first one's environment, and a command started in the second runs
the first one's code, records its commit and writes its default store: an A/B of two
commits made so compares one commit with itself. ``other_checkout`` finds that case, and
the command line warns of it (``harness.cli.app.main``); ``PYTHONPATH=<the checkout>``
runs the checkout's own code.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

__all__ = ["REPO", "RESULTS", "other_checkout"]

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"


def other_checkout(cwd: Path, repo: Path = REPO) -> Path | None:
    """The pipebench checkout that holds ``cwd`` where it is not ``repo`` (the one whose
    code runs); None where ``cwd`` is in ``repo`` or in no checkout of pipebench, and where
    it cannot be told (a folder or file that cannot be read). The nearest
    ``pyproject.toml`` at or above ``cwd`` decides, by its ``[project]`` name."""
    try:
        cwd, repo = cwd.resolve(), repo.resolve()
        for folder in (cwd, *cwd.parents):
            project = folder / "pyproject.toml"
            if not project.is_file():
                continue
            if folder == repo:
                return None
            table = tomllib.loads(project.read_text(encoding="utf-8")).get("project", {})
            return folder if isinstance(table, dict) and table.get("name") == "pipebench" \
                else None
    except (OSError, ValueError):  # unreadable, not UTF-8, not TOML (TOMLDecodeError)
        return None
    return None
