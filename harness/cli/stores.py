"""Commands on MLflow stores: ``sync`` copies the runs that fell back to the local store
(their tracking server was down or died) to that server once it is back."""

from __future__ import annotations

from typing import Annotated

import typer

from harness.cli.app import app, console

__all__ = ["sync"]


@app.command()
def sync(
    to: Annotated[str, typer.Option("--to", help="the tracking server to copy to, e.g. "
                                    "http://HOST:5000")],
    source: Annotated[str | None, typer.Option("--from", help="the store to copy from "
                                               "(default: the local store, "
                                               "PIPEBENCH_LOCAL_TRACKING_URI or "
                                               "sqlite:///<repo>/results/mlflow.db)")] = None,
    experiment: Annotated[str | None, typer.Option(help="only this experiment")] = None,
    all_runs: Annotated[bool, typer.Option("--all", help="every finished run, not only "
                                           "those that fell back from --to")] = False,
    quiet: Annotated[bool, typer.Option(help="no line per run")] = False,
) -> None:
    """Copy runs to a tracking server: params, tags, every metric's history, artifacts,
    status, times and parent links.

    Runs already copied there are skipped."""
    from rich.console import Console

    from harness.reporting.progress import Progress
    from harness.reporting.sync import sync_runs

    lines = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)
    report = sync_runs(to, source, experiment, all_runs, Progress(not quiet, lines))
    console.print(report.summary(), highlight=False, markup=False, soft_wrap=True)
