"""How a run is stopped from outside: Ctrl-C (``KeyboardInterrupt``) or SIGTERM (``Terminated``).

A job scheduler ends a job with SIGTERM ("time is up"). During a run, ``on_sigterm`` turns
it into ``Terminated`` in the main thread, so the run unwinds the way Ctrl-C does: the
runner writes the newest finished epoch's checkpoint, stops every worker, and the MLflow
run ends KILLED (``is_interrupt``). ``Terminated`` is not a ``KeyboardInterrupt``: the CLI
library would fold it into a plain exit code 130, and the command must exit 143 instead.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Terminated", "is_interrupt", "on_sigterm"]


class Terminated(BaseException):
    """SIGTERM arrived during a run."""


def is_interrupt(error: BaseException) -> bool:
    """Stopped from outside (Ctrl-C or SIGTERM) rather than failed."""
    return isinstance(error, KeyboardInterrupt | Terminated)


@contextmanager
def on_sigterm() -> Iterator[None]:
    """While the body runs, SIGTERM raises ``Terminated`` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:  # noqa: ARG001
        raise Terminated(f"terminated by signal {signal.Signals(signum).name}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
