"""``pipebench``: the typer app with every command registered (see ``app.py``)."""

from harness.cli import (  # noqa: F401 - registers them
    judging,
    planning,
    simulation,
    stores,
    suites,
    train,
)
from harness.cli.app import app, main

__all__ = ["app", "main"]
