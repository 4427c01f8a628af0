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

import sys
from pathlib import Path

import typer
from rich.console import Console

from core.errors import UserInputError

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
    except (KeyboardInterrupt, typer.Abort) as e:  # click turns Ctrl-C into Abort
        # Ctrl-C, or SIGTERM during a run (harness.experiments.checkpoint.Terminated)
        cause = e.__cause__ if isinstance(e, typer.Abort) else e
        terminated = type(cause).__name__ == "Terminated"
        what = str(cause) if terminated else "interrupted (Ctrl-C)"
        Console(stderr=True).print(f"{what}: every worker was stopped; a run in progress is "
                                   f"marked KILLED in MLflow", highlight=False, markup=False)
        sys.exit(143 if terminated else 130)
    except Exception as e:  # click usage errors (unknown option, missing value)
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(2)
        raise
    if isinstance(code, int) and code:
        sys.exit(code)


