"""``pipebench``: the typer app with every command registered (see ``app.py``)."""

from harness.cli import planning, simulation, stores, suites, train  # noqa: F401 - registers them
from harness.cli.app import app, main

__all__ = ["app", "main"]
