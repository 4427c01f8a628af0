"""The ``pipebench`` command line: flags become dataclasses, library functions do the work.

This module holds the typer app, the console and ``main``; the commands live beside it
(``train``: workloads, run, compare-run; ``suites``: bench, regressions, compare,
dashboard; ``stores``: sync; ``planning``: profile, plan, planner-table, schedule;
``simulation``: simulate, reproduce; ``options``: flags they share). Commands import what they
need inside their bodies, so ``pipebench --help``, ``plan``, ``simulate``, ``schedule``
and ``reproduce table1`` start without importing torch or mlflow
(tests/harness/cli/test_imports.py).

Wrong input raises ``UserInputError``; ``main`` prints its message as one line and exits 2.

A command's help is its docstring: a first paragraph of one sentence (the line shown in
``pipebench --help``), then paragraphs of detail, separated by blank lines. ``reflow`` joins
each paragraph's source lines (typer's rich output would keep them as hard breaks), so the
terminal wraps the text; a line starting with ``- `` stays a line of its own (a list).
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from core.errors import UserInputError
from core.interrupts import Terminated

__all__ = ["app", "console", "emit", "main", "reflow"]


def reflow(doc: str) -> str:
    """``doc`` dedented, with each paragraph's lines joined into one (list items, lines
    starting with ``- ``, keep a line each); paragraphs stay separated by a blank line."""
    paragraphs = []
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            line = line.strip()
            if lines and not line.startswith("- "):
                lines[-1] += " " + line
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


class _Typer(typer.Typer):
    """A typer app whose commands' help is their docstring through ``reflow``."""

    def command(self, name: str | None = None, **kwargs: Any) -> Callable:
        def register(f: Callable) -> Callable:
            if kwargs.get("help") is None and f.__doc__:
                kwargs["help"] = reflow(f.__doc__)
            return typer.Typer.command(self, name, **kwargs)(f)

        return register


app = _Typer(add_completion=False, no_args_is_help=True,
             help="Benchmark harness: PipeDream, GPipe and data parallelism side by side.")
# soft wrap: a line is printed whole and the terminal folds it, so a report piped to a file
# or read by a program keeps its table rows and paths on one line (a Console that is not a
# terminal is 80 columns wide and would break them there); for the same reason a table
# printed where there is no terminal (and no COLUMNS) may be PIPE_WIDTH wide, where 80
# columns would cut its cells short ("ImageFo...", a plan's ranks)
PIPE_WIDTH = 200
console = Console(soft_wrap=True)
if not console.is_terminal and "COLUMNS" not in os.environ:
    console.width = PIPE_WIDTH


def emit(text: str, output: str | None, quiet: bool = False) -> None:
    """Print a generated markdown report and write it to ``output`` when given; with
    ``quiet`` and an ``output``, only write it (the file is the result)."""
    if quiet and output:
        Path(output).write_text(text)
        return
    console.print(text, markup=False)
    if output:
        Path(output).write_text(text)
        console.print(f"wrote {output}", markup=False)


def command_line() -> str:
    """The command as the user typed it (recorded in generated reports)."""
    return " ".join(["pipebench"] + sys.argv[1:])


def main() -> None:
    import logging

    # MLflow's INFO lines when it creates a store's tables ("Creating initial MLflow
    # database tables...") are noise on a first run, and printed even under --quiet
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    _warn_other_checkout()
    interrupted = _count_ctrl_c()
    try:
        code = app(standalone_mode=False)  # click returns typer.Exit's code here
    except UserInputError as e:
        _error(str(e), 2)
    except (typer.Exit, typer.Abort, KeyboardInterrupt) as e:  # before RuntimeError: typer's
        if isinstance(e, typer.Exit):  # Exit and Abort are RuntimeErrors
            sys.exit(e.exit_code)
        _stopped("interrupted (Ctrl-C)", 130)
    except RuntimeError as e:
        from pipedream_impl.runtime.launcher import PipelineFailure

        if not isinstance(e, PipelineFailure):
            raise
        _error(str(e), 1)
    except Terminated as e:  # SIGTERM during a run (core.interrupts)
        _stopped(str(e), 143)
    except Exception as e:  # click usage errors (unknown option or command, missing value)
        if not isinstance(e, _usage_errors()):
            raise
        e.show()
        sys.exit(2)
    if interrupted and code == 130:  # typer turns KeyboardInterrupt into exit code 130
        _stopped("interrupted (Ctrl-C)", 130)
    if isinstance(code, int) and code:
        sys.exit(code)


def _warn_other_checkout() -> None:
    """Say so where the command was started in a checkout of pipebench whose code is not
    the code that runs (an editable install of another checkout: ``harness.paths``)."""
    from harness.paths import REPO, other_checkout

    try:
        cwd = Path.cwd()
    except OSError:  # the working directory is gone: nothing to tell
        return
    here = other_checkout(cwd)  # None on anything it cannot read
    if here is not None:
        Console(stderr=True).print(
            f"warning: started in the checkout {here}, but the code that runs is {REPO}'s "
            f"(its commit is the one recorded); PYTHONPATH={here} runs this checkout's "
            f"own code", highlight=False, markup=False, soft_wrap=True)


def _error(message: str, code: int) -> None:
    Console(stderr=True).print(f"error: {message}", highlight=False, markup=False,
                               soft_wrap=True)
    sys.exit(code)


def _usage_errors() -> tuple[type[Exception], ...]:
    """click's usage errors: typer 0.2x raises those of its own copy of click."""
    import click

    kinds: list[type[Exception]] = [click.ClickException]
    try:
        from typer._click.exceptions import ClickException
    except ImportError:  # typer before it vendored click
        pass
    else:
        kinds.append(ClickException)
    return tuple(kinds)


def _count_ctrl_c() -> list[int]:
    """Ctrl-C raises KeyboardInterrupt as usual and is counted, so ``main`` can tell an
    interrupted command (which typer reports as exit code 130) from other exits."""
    seen: list[int] = []
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:

        def handler(signum: int, frame: object) -> None:
            seen.append(signum)
            signal.default_int_handler(signum, frame)

        signal.signal(signal.SIGINT, handler)
    return seen


def _stopped(what: str, code: int) -> None:
    Console(stderr=True).print(f"{what}: every worker was stopped; a run in progress is "
                               f"marked KILLED in MLflow", highlight=False, markup=False,
                               soft_wrap=True)
    sys.exit(code)
