"""One error type for wrong user input, narrow subclasses where a caller needs them, and
the few checks every edge of the program uses to raise it.

The CLI prints any ``UserInputError`` as one line (``error: ...``) and exits with code 2,
so every message must say what was wrong and how to fix it. A subclass exists only where
some caller catches or reports that kind apart from the rest: ``WorkloadError`` (a
workload's name, scale, data or split; ``compare-run`` shows it as "n/a" for a system that
cannot run the workload), ``GraphFormatError`` (a profile file that does not parse; the
message names the line) and ``ScheduleError`` (a schedule that cannot run: a bad config
string, a deadlock, an out-of-order action).

Validation happens once, at the edge: config dataclasses check their fields in
``__post_init__``, file readers check what they read, and both use the helpers below so
that the same mistake reads the same everywhere ("--lr must be a positive number (got
nan)"): ``require_int``, ``require_number``, ``read_text`` (a file that exists, is a file
and is text) and ``require_output`` (a file we may write: checked before any work starts,
so a bad ``-o`` never costs a long computation).
"""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["GraphFormatError", "ScheduleError", "UserInputError", "WorkloadError", "lookup",
           "parse_ints", "read_text", "require_int", "require_number", "require_output"]


class UserInputError(ValueError):
    """Wrong input from the user: a flag, a file, a name or a combination of them."""


class WorkloadError(UserInputError):
    """Wrong input about a workload: unknown name, bad scale, missing or malformed data,
    a split the workload (or a system) cannot run."""


class GraphFormatError(UserInputError):
    """A graph.txt or profile file that cannot be parsed (the message names the line)."""


class ScheduleError(UserInputError):
    """A schedule that cannot run or a layout that cannot be scheduled."""


def lookup(table: dict, name: str, what: str):  # noqa: ANN201 - the table's value type
    """``table[name]``, or one line naming the choices: "unknown schedule 'x'; choose one
    of: a, b" (the registries' lookups)."""
    try:
        return table[name]
    except KeyError:
        raise UserInputError(f"unknown {what} {name!r}; choose one of: "
                             f"{', '.join(table)}") from None


def require_int(flag: str, value: int | None, low: int = 1, high: int | None = None,
                why: str = "") -> None:
    """``value`` (None: a default, accepted) lies in ``[low, high]``; ``why`` says why the
    upper bound exists and how to get past it."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserInputError(f"{flag} must be a whole number (got {value!r})")
    if value < low:
        what = {0: "0 or more", 1: "at least 1"}.get(low, f"at least {low}")
        raise UserInputError(f"{flag} must be {what} (got {value})")
    if high is not None and value > high:
        raise UserInputError(f"{flag} must be at most {high} (got {value})"
                             + (f": {why}" if why else ""))


def require_number(flag: str, value: float | None, low: float = 0.0, strict: bool = True,
                   high: float | None = None, example: str = "") -> None:
    """``value`` (None: a default, accepted) is finite and above ``low`` (or equal to it
    when not ``strict``) and at most ``high``; ``example`` shows a good value."""
    if value is None:
        return
    hint = f"; e.g. {flag} {example}" if example else ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserInputError(f"{flag} must be a number (got {value!r}){hint}")
    if low == 0.0:
        what = "a positive number" if strict else "0 or a positive number"
    else:
        what = f"a number {'above' if strict else 'of at least'} {low:g}"
    if high is not None:
        what += f" up to {high:g}"
    if not math.isfinite(value) or value < low or (strict and value == low) \
            or (high is not None and value > high):
        raise UserInputError(f"{flag} must be {what} (got {value}){hint}")


def parse_ints(flag: str, text: str, low: int = 1) -> tuple[int, ...]:
    """A comma-separated list of whole numbers, e.g. ``--workers 1,2,4``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise UserInputError(f"{flag} must be comma-separated whole numbers, e.g. 1,2,4 "
                             f"(got {text!r})") from None
    if not values:
        raise UserInputError(f"{flag} needs at least one number, e.g. 1,2,4")
    for v in values:
        require_int(flag, v, low)
    return values


def read_text(path: str | Path, what: str, hint: str = "") -> str:
    """The text of ``path``, or one clear error: missing, a folder, unreadable, not text.
    ``what`` names the file for people ("plan", "profile"); ``hint`` says where a good one
    comes from."""
    p = Path(path)
    tail = f"; {hint}" if hint else ""
    if not p.exists():
        raise UserInputError(f"{what} {path} does not exist{tail}")
    if p.is_dir():
        raise UserInputError(f"{what} {path} is a folder, not a file{tail}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserInputError(f"{what} {path} is not a text file (not UTF-8){tail}") from None
    except OSError as e:
        raise UserInputError(f"cannot read {what} {path}: {e.strerror}{tail}") from None


def require_output(path: str | None, flag: str = "--output") -> None:
    """A file we may write later: not a folder, in a folder that exists."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise UserInputError(f"{flag} {path} is a folder; give a file name inside it")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserInputError(f"{flag} {path}: the folder {parent} does not exist; create it "
                             f"first (mkdir -p {parent}) or write somewhere else")
