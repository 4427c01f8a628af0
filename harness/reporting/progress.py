"""Progress display: rich progress bars on a terminal, one line per note otherwise.

Library code reports through a ``Progress`` so tests and workers can silence it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

__all__ = ["Progress", "quiet"]


class Progress:
    def __init__(self, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True, soft_wrap=True)  # as cli.app's

    def note(self, message: str) -> None:
        if self.enabled:
            # notes carry error texts verbatim (gloo's "[/path/pair.cc:545]" is not markup)
            self.console.print(message, highlight=False, markup=False)

    @contextmanager
    def task(self, description: str, total: int) -> Iterator[Callable[[float], None]]:
        """Yields ``advance(loss)``; draws a bar only on an interactive terminal."""
        if not self.enabled or not self.console.is_terminal:
            yield lambda loss: None
            return
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.4f}"), TimeRemainingColumn())
        with RichProgress(*columns, console=self.console, transient=True) as bar:
            tid = bar.add_task(description, total=total, loss=float("nan"))
            yield lambda loss: bar.update(tid, advance=1, loss=loss)


def quiet() -> Progress:
    return Progress(enabled=False, console=Console(file=sys.stderr))
