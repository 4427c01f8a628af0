"""The one markdown table writer: every generated report in results/ goes through it.

A cell may contain ``|`` (e.g. an error message): it is written as ``/`` so the table
keeps its columns.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["markdown_table"]


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """Lines of a GitHub markdown table: header, separator, one line per row."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in row) + " |" for row in rows]
    return lines
