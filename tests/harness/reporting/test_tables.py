"""tables.print_summary: a run's closing table names its MLflow run, or says there is none,
and says why a throughput was not measured instead of printing "nan".

Why: with ``PIPEBENCH_TRACKING=off`` the table printed "None in None" and a ``mlflow ui``
command for a store called None, which a new user would try to follow.
"""

from __future__ import annotations

from rich.console import Console

from harness.config import RunConfig
from harness.experiments.training import EpochStats, RunSummary
from harness.reporting.tables import print_summary


def _summary(run_id: str | None, uri: str | None) -> RunSummary:
    s = RunSummary(RunConfig.from_flags(system="single", workload="vgg16", epochs=1), "top1", 0.9)
    s.epochs = [EpochStats(loss_sum=1.0, steps=1, samples=32)]
    s.qualities, s.elapsed_s = [0.1], [1.0]
    s.run_id, s.tracking_uri = run_id, uri
    return s


def _printed(summary: RunSummary) -> str:
    console = Console(record=True, width=200)
    print_summary(summary, console)
    return console.export_text()


def test_a_tracked_run_names_its_run_and_store() -> None:
    text = _printed(_summary("ab" * 16, "sqlite:///x.db"))
    assert f"{'ab' * 16} in sqlite:///x.db" in text
    assert "browse: mlflow ui --backend-store-uri sqlite:///x.db" in text


def test_an_untracked_run_says_so_and_offers_no_store() -> None:
    text = _printed(_summary(None, None))
    assert "none (tracking off)" in text
    assert "None" not in text and "browse" not in text


def test_a_run_of_warm_up_steps_only_says_its_throughput_was_not_measured() -> None:
    """``--max-steps 2`` with the default two warm-up steps times no step: the table printed
    "nan samples/s"."""
    summary = _summary("ab" * 16, "sqlite:///x.db")
    assert summary.throughput != summary.throughput  # NaN: no step was timed
    text = _printed(summary)
    assert "nan" not in text.lower()
    assert f"not measured: no step after the first {summary.config.warmup_steps}" in text
    summary.epochs = [EpochStats(loss_sum=1.0, steps=4, samples=128, timed_samples=64,
                                 timed_s=0.5)]
    assert "128.0 samples/s" in _printed(summary)  # 64 samples timed over 0.5 s
