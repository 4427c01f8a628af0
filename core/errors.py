"""One error type for wrong user input, with narrow subclasses where a caller needs them.

The CLI prints any ``UserInputError`` as one line (``error: ...``) and exits with code 2,
so every message must say what was wrong and how to fix it. A subclass exists only where
some caller catches or reports that kind apart from the rest: ``WorkloadError`` (a
workload's name, scale, data or split; ``compare-run`` shows it as "n/a" for a system that
cannot run the workload), ``GraphFormatError`` (a profile file that does not parse; the
message names the line) and ``ScheduleError`` (a schedule that cannot run: a bad config
string, a deadlock, an out-of-order action).
"""

from __future__ import annotations

__all__ = ["GraphFormatError", "ScheduleError", "UserInputError", "WorkloadError"]


class UserInputError(ValueError):
    """Wrong input from the user: a flag, a file, a name or a combination of them."""


class WorkloadError(UserInputError):
    """Wrong input about a workload: unknown name, bad scale, missing or malformed data,
    a split the workload (or a system) cannot run."""


class GraphFormatError(UserInputError):
    """A graph.txt or profile file that cannot be parsed (the message names the line)."""


class ScheduleError(UserInputError):
    """A schedule that cannot run or a layout that cannot be scheduled."""
