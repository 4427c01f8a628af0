"""core/markdown.py: tables that a markdown reader splits back into the same cells."""

from __future__ import annotations

from core.markdown import markdown_table


def _cells(line: str) -> list[str]:
    assert line.startswith("| ") and line.endswith(" |")
    return [c.strip() for c in line[2:-2].split(" | ")]


def test_rows_split_back_into_their_cells_and_pipes_cannot_add_columns() -> None:
    rows = [["pipedream", "1-1", 1.5], ["ddp", "n/a: a | b", ""]]
    lines = markdown_table(("system", "config", "x"), rows)
    assert lines[1] == "|---|---|---|"
    assert _cells(lines[0]) == ["system", "config", "x"]
    assert _cells(lines[2]) == ["pipedream", "1-1", "1.5"]
    assert _cells(lines[3]) == ["ddp", "n/a: a / b", ""]
    assert len(lines) == 2 + len(rows)
