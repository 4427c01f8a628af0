"""The MLflow experiment a user most likely means: the one holding the newest training run.

Why: ``run`` and ``compare-run`` log to ``pipebench``, ``bench`` to ``pipebench-suite``,
``reproduce validation`` to ``pipebench-validation``; ``pipebench compare`` with no
``--experiment`` shows the runs the user just made, wherever they were logged.
"""

from __future__ import annotations

from harness.reporting import tracking

__all__ = ["newest_experiment"]

# training runs log a system param, as in store.search_runs (suite and cell runs have tags)
_TRAINING_RUNS = "params.system != ''"


def newest_experiment() -> str | None:
    """The name of the experiment of the newest training run in the store (by start time),
    or None when the store holds no training run."""
    import mlflow

    mlflow.set_tracking_uri(tracking.default_tracking_uri())
    runs = mlflow.search_runs(search_all_experiments=True, filter_string=_TRAINING_RUNS,
                              order_by=["attributes.start_time DESC"], max_results=1,
                              output_format="list")
    if not runs:
        return None
    return mlflow.get_experiment(runs[0].info.experiment_id).name
