"""``pipebench regressions``: judge a suite result against a baseline or a history of
results (``harness.reporting.regressions``), at the rule's false-alarm rate per comparison.
Kept apart from ``suites`` (running suites and showing them), which it does not need."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from core.errors import UserInputError, require_output
from harness.cli.app import app, emit
from harness.cli.options import Output

__all__ = ["check_dir", "regressions"]


@app.command()
def regressions(
    current: Annotated[str, typer.Option(help="the suite result to judge: a JSON file or the "
                                         "MLflow run id of a suite")],
    baseline: Annotated[str | None, typer.Option(help="compare with this result (file or "
                                                 "run id)")] = None,
    history: Annotated[int | None, typer.Option(help="compare with the last N results of "
                                                "the same suite on the same machine (the "
                                                "MLflow store, or --history-dir)")] = None,
    experiment: Annotated[str | None, typer.Option(help="MLflow experiment of the history "
                                                   "(default: the current result's)")] = None,
    history_dir: Annotated[str | None, typer.Option(help="with --history: read it from the "
                                                    "suite results (*.json) here")] = None,
    alpha: Annotated[float | None, typer.Option(
        help="false-alarm rate per comparison: the chance that any judged noisy metric "
             "flags where nothing changed, split equally over them "
             "(default: harness.reporting.verdicts.SUITE_ALPHA)")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="also list moves within the "
                                           "noise")] = False,
    output: Output = None,
) -> None:
    """Compare suite results: exact counters must match, noisy metrics are judged by a test
    with a stated false-alarm rate, and each says the smallest change it could detect.

    Exit code 1 on a regression."""
    from core.markdown import markdown_table
    from harness.reporting import change_report as report
    from harness.reporting import regressions as reg
    from harness.reporting import verdicts
    from harness.reporting.store import load_result_or_run

    _check_against(baseline, history, experiment, history_dir)
    require_output(output)
    rate = _rate(alpha)
    cur = load_result_or_run(current)
    if baseline is not None:
        bases, against = [load_result_or_run(baseline)], baseline
        changes, _, judged = reg.compare_at_rate(bases, cur, rate)
    else:  # one result more: the night before is judged against its own history
        bases, where = _history(cur, history + 1, experiment, history_dir)
        against = (f"the last {len(bases[-history:])} {cur['suite']['name']} result(s) "
                   f"of this machine {where}, labelled over nights")
        if not bases:
            emit(f"# Regressions: {current}\n\nNo earlier {cur['suite']['name']} result "
                 f"of machine {cur['environment']['machine']!r} {where}: nothing to "
                 "compare.\n", output)
            return
        changes, _, judged = reg.over_nights_at_rate(bases, cur, history, rate)
    lines = [f"# Regressions: {current} against {against}", "", report.compared(bases, cur),
             "", f"Rule: {verdicts.rule_text(rate, judged)}.", "",
             *report.switches_differ(bases, cur)]
    table = report.rows(changes, show_all)
    lines += markdown_table(report.COLUMNS, table) if table else ["Nothing moved beyond "
                                                               "the noise."]
    verdict = "REGRESSION" if reg.has_regression(changes) else "no regression"
    lines += ["", report.detectability(changes), "", f"Verdict: {verdict}."]
    emit("\n".join(lines) + "\n", output)
    if reg.has_regression(changes):
        raise typer.Exit(1)


def _rate(alpha: float | None) -> float:
    """``--alpha``: the rate per comparison (``verdicts.SUITE_ALPHA`` unless given), checked."""
    from harness.reporting import verdicts

    rate = verdicts.SUITE_ALPHA if alpha is None else alpha
    if not 0 < rate < 0.5:
        raise UserInputError(f"--alpha must be in (0, 0.5) (got {rate})")
    return rate


def _check_against(baseline: str | None, history: int | None, experiment: str | None,
                   history_dir: str | None) -> None:
    """What ``regressions`` compares with: a baseline, or a history in the store or in a
    directory (not both; ``--experiment`` names a store's experiment)."""
    if (baseline is None) == (history is None):
        raise UserInputError("give --baseline FILE|RUN or --history N (one of them)")
    if history is not None and history < 1:
        raise UserInputError(f"--history must be at least 1 (got {history})")
    if history_dir is not None:
        if history is None:
            raise UserInputError("--history-dir needs --history N")
        if experiment is not None:
            raise UserInputError("--experiment names the store's history; --history-dir "
                                 "reads files instead: give one of them")
        check_dir(history_dir)


def check_dir(directory: str) -> None:
    if not Path(directory).is_dir():
        raise UserInputError(f"--history-dir {directory}: no such directory")


def _history(cur: dict, n: int, experiment: str | None,
             directory: str | None) -> tuple[list[dict], str]:
    """The last ``n`` results before ``cur`` (store or directory) and where they were found."""
    from harness.reporting.store import file_history, suite_history

    if directory is not None:
        return file_history(cur, n, directory), f"in {directory}"
    return suite_history(cur, n, experiment), "in the MLflow store"
