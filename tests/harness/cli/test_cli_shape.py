"""harness/cli's shape, read off the source and the typer app: commands are short (they
delegate), and their help reads well at any terminal width.

Typer's rich output keeps a source line break inside a paragraph as a hard break (in the
command list of ``pipebench --help``, at any width), so help texts must hold none:
``app.reflow`` joins each docstring paragraph's lines, and option help strings are single
lines. ``compare`` and ``compare-run`` each say what they do and point at the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import typer

from harness.cli import app
from harness.cli.app import reflow

CLI = Path(__file__).resolve().parents[3] / "harness" / "cli"
MAX_LINES = 60


def _long_functions(folder: Path, limit: int = MAX_LINES) -> list[tuple[str, str, int]]:
    """(file, function, lines) of every function or method longer than ``limit`` lines,
    from its ``def`` line to its last line (signature and docstring included)."""
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append((path.name, node.name, lines))
    return found


def test_no_function_in_harness_cli_is_over_60_lines() -> None:
    assert _long_functions(CLI) == []


def test_the_length_check_finds_a_long_function(tmp_path: Path) -> None:
    """The check can fail: a planted 61-line function (and a nested one) is found."""
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    (tmp_path / "nested.py").write_text(f"class C:\n    def m(self):\n        def inner():\n"
                                        f"{body.replace('    ', '            ')}")
    assert _long_functions(tmp_path) == [("long.py", "long", 61), ("nested.py", "m", 62),
                                         ("nested.py", "inner", 61)]


def _commands() -> dict:
    return typer.main.get_command(app).commands


def test_every_command_has_a_one_line_summary_and_no_hard_breaks() -> None:
    commands = _commands()
    assert {"run", "compare", "compare-run", "bench", "reproduce"} <= set(commands)
    for name, command in commands.items():
        summary, *details = command.help.split("\n\n")
        assert summary and "\n" not in summary, name
        for paragraph in details:  # a line break only before a list item
            assert all(line.startswith("- ") for line in paragraph.splitlines()[1:]), name
        for param in command.params:
            assert "\n" not in (param.help or ""), (name, param.name)


def test_reflow_joins_a_hard_wrapped_docstring() -> None:
    doc = """First sentence, wrapped
    in the source.

    Details, also
    wrapped.
    - an item
      continued
    - another item"""
    assert reflow(doc) == ("First sentence, wrapped in the source.\n\n"
                           "Details, also wrapped.\n- an item continued\n- another item")


def test_compare_and_compare_run_say_which_is_which() -> None:
    commands = _commands()
    compare = commands["compare"].help.split("\n\n")[0]
    compare_run = commands["compare-run"].help.split("\n\n")[0]
    assert compare.startswith("Tabulate runs already in the MLflow store")
    assert "see compare-run" in compare
    assert compare_run.startswith("Run several systems now, then tabulate them")
    assert "see compare for" in compare_run
