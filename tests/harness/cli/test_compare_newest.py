"""``pipebench compare`` with no ``--experiment`` shows the runs the user just made.

``bench`` logs to ``pipebench-suite``, ``run`` to ``pipebench``: ``compare`` alone picks
the experiment holding the newest training run, says which on stderr, and still fails
with one clear line on a store without runs. One real sqlite store for the module (an
empty copy of it is taken before any run is logged); runs are logged with MlflowClient,
with start times set, so nothing trains here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from harness.paths import REPO

pytestmark = pytest.mark.cli

T0 = int(time.time() * 1000) - 3_600_000  # an hour ago, in ms


def _training_run(client, experiment: str, system: str, start_ms: int) -> str:  # noqa: ANN001
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    run = client.create_run(exp_id, start_time=start_ms, run_name=f"{system}-run")
    for k, v in {"system": system, "workload": "vgg16", "scale": "tiny", "workers": "2"}.items():
        client.log_param(run.info.run_id, k, v)
    client.log_metric(run.info.run_id, "throughput_samples_per_s", 100.0)
    client.set_terminated(run.info.run_id, "FINISHED", end_time=start_ms + 1000)
    return run.info.run_id


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An empty store, and one with an older run in ``pipebench`` and a newer one in
    ``pipebench-suite`` under a suite run that started later still (no system param)."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("compare-newest")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.search_experiments()  # creates the store's tables
    shutil.copy(root / "mlflow.db", root / "empty.db")
    # created newest first: the order of start times, not of creation, decides
    suite_exp = client.create_experiment("pipebench-suite")
    parent = client.create_run(suite_exp, start_time=T0 + 200_000, run_name="suite-smoke",
                               tags={"pipebench.kind": "suite"})
    client.set_terminated(parent.info.run_id, "FINISHED")
    newer = _training_run(client, "pipebench-suite", "ddp", T0 + 100_000)
    older = _training_run(client, "pipebench", "pipedream", T0)
    return {"uri": uri, "empty": f"sqlite:///{root / 'empty.db'}", "newer": newer,
            "older": older}


def _compare(args: list[str], uri: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "compare", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "MLFLOW_TRACKING_URI": uri})


def test_compare_shows_the_experiment_of_the_newest_training_run(stores: dict) -> None:
    r = _compare(["--format", "json"], stores["uri"])
    assert r.returncode == 0, r.stderr
    assert [x["run_id"] for x in json.loads(r.stdout)] == [stores["newer"]]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "experiment 'pipebench-suite'" in lines[0], r.stderr
    md = _compare([], stores["uri"])
    assert md.returncode == 0 and md.stdout.startswith("# Runs in pipebench-suite\n")


def test_a_named_experiment_is_shown_as_asked(stores: dict) -> None:
    r = _compare(["--experiment", "pipebench", "--format", "json"], stores["uri"])
    assert r.returncode == 0, r.stderr
    assert [x["run_id"] for x in json.loads(r.stdout)] == [stores["older"]]
    assert r.stderr == ""


def test_a_store_without_runs_is_one_clear_line(stores: dict) -> None:
    r = _compare([], stores["empty"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: no training runs in {stores['empty']} (run, " \
                               f"compare-run and bench make them)"
    missing = _compare(["--experiment", "nope"], stores["empty"])
    assert missing.returncode == 2 and "no MLflow experiment 'nope'" in missing.stderr
