"""The ``pipebench`` command line: flags become dataclasses, library functions do the work.

This module holds the typer app, the console and ``main``; the commands live beside it
(``train``: workloads, run, compare-run, bench; ``planning``: profile, plan,
planner-table, schedule; ``simulation``: simulate, reproduce). Commands import what they
need inside their bodies, so ``pipebench --help``, ``plan``, ``simulate``, ``schedule``
and ``reproduce table1`` start without importing torch or mlflow
(tests/harness/cli/test_imports.py).

Wrong input raises ``UserInputError``; ``main`` prints its message as one line and exits 2.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import typer
from rich.console import Console

from core.errors import UserInputError
from core.interrupts import Terminated

__all__ = ["app", "console", "emit", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark harness: PipeDream, GPipe and data parallelism side by side.")
console = Console()


def emit(text: str, output: str | None) -> None:
    """Print a generated markdown report and write it to ``output`` when given."""
    console.print(text, markup=False)
    if output:
        Path(output).write_text(text)
        console.print(f"wrote {output}", markup=False)


def command_line() -> str:
    """The command as the user typed it (recorded in generated reports)."""
    return " ".join(["pipebench"] + sys.argv[1:])


def main() -> None:
    interrupted = _count_ctrl_c()
    try:
        code = app(standalone_mode=False)  # click returns typer.Exit's code here
    except UserInputError as e:
        Console(stderr=True).print(f"error: {e}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(2)
    except RuntimeError as e:
        from pipedream_impl.runtime.launcher import PipelineFailure

        if not isinstance(e, PipelineFailure):
            raise
        Console(stderr=True).print(f"error: {e}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Terminated as e:  # SIGTERM during a run (core.interrupts)
        _stopped(str(e), 143)
    except (KeyboardInterrupt, typer.Abort):
        _stopped("interrupted (Ctrl-C)", 130)
    except Exception as e:  # click usage errors (unknown option, missing value)
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(2)
        raise
    if interrupted and code == 130:  # typer turns KeyboardInterrupt into exit code 130
        _stopped("interrupted (Ctrl-C)", 130)
    if isinstance(code, int) and code:
        sys.exit(code)


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
