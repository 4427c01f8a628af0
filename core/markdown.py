"""The one markdown table writer: every generated report in results/ goes through it; and
the scripts' one way of handing a finished report over (to a file, or to stdout).

A cell may contain ``|`` (e.g. an error message): it is written as ``/`` so the table
keeps its columns.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["markdown_table", "write_report"]


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Lines of a GitHub markdown table: header, separator, one line per row."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return lines


def write_report(text: str, output: Path | None, who: str) -> None:
    """``text`` to ``output`` (saying so on stderr, as ``who``), else to stdout."""
    if output:
        output.write_text(text)
        print(f"{who}: wrote {output}", file=sys.stderr)
    else:
        print(text, end="")
