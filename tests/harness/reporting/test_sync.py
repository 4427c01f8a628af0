"""harness/reporting/sync.py through ``pipebench sync``: runs that fell back to the local
store while their server was down reach that server, once it is up, exactly as logged
(params, tags, every metric's history with steps, timestamps and values, artifacts,
status, times, the parent link remapped); a second sync copies nothing; a bad or
unreachable URI is a one-line error with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.paths import REPO
from harness.reporting import fallback, sync, tracking
from tests.harness.reporting.mlflow_server import MlflowServer, free_port

pytestmark = pytest.mark.cli
EXPERIMENT = "sync-test"


def _client(uri: str):  # noqa: ANN202
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _fallen_runs(server_uri: str) -> list[str]:
    """With the server down: a suite-shaped tree (parent, cell, training run with a
    metric history and artifacts) and a failed run; ids in the local store."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with tracking.detached_run(EXPERIMENT, "suite", {"pipebench.kind": "suite"}) as parent:
        cell = parent.child("cell", {"pipebench.kind": "cell"})
        with tracking.tracked_run(EXPERIMENT, "train", tags={"team": "perf"},
                                  parent_run_id=cell.run_id) as train:
            train.params({"workload": "vgg16", "lr": 0.01, "epochs": 5})
            for step in range(5):
                train.metrics({"quality": 0.2 * step, "train_loss": 5.0 - step}, step=step)
            train.metrics({"throughput_samples_per_s": 123.5})
            train.text("plan", "plan.json")
            train.json({"traceEvents": []}, "traces/trace.json")
            fig = plt.figure()
            plt.plot([0, 1], [1, 0])
            train.figure(fig, "curves.png")
        cell.metrics({"throughput_samples_per_s": 123.5})
    with pytest.raises(RuntimeError):
        with tracking.tracked_run(EXPERIMENT, "broken") as broken:
            broken.metrics({"quality": 0.1}, step=0)
            raise RuntimeError("worker died")
    return [parent.run_id, cell.run_id, train.run_id, broken.run_id]


@pytest.fixture(scope="module")
def fell_back(mlflow_uri: str, tmp_path_factory: pytest.TempPathFactory) \
        -> Iterator[tuple[str, str, list[str]]]:
    """(local store, server, local run ids): runs logged while the server's port was
    closed, then the server started on that port."""
    server = MlflowServer(tmp_path_factory.mktemp("sync-server"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPEBENCH_LOCAL_TRACKING_URI", mlflow_uri)
        mp.setenv("MLFLOW_TRACKING_URI", server.uri)  # nothing listens there yet
        ids = _fallen_runs(server.uri)
        mp.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
        with tracking.tracked_run(EXPERIMENT, "meant-for-another-server") as other:
            other.metrics({"quality": 1.0})  # in the same store, fell back from elsewhere
        mp.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
        with tracking.tracked_run(EXPERIMENT, "local-only") as local_only:
            local_only.metrics({"quality": 1.0})
    assert {_client(mlflow_uri).get_run(i).data.tags[fallback.INTENDED_TAG]
            for i in ids} == {server.uri}
    fallback.forget_fallbacks()  # the server comes up on that port now
    server.start()
    try:
        yield mlflow_uri, server.uri, ids
    finally:
        server.kill()


def _sync(*args: str, local: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIPEBENCH_LOCAL_TRACKING_URI": local}
    return subprocess.run([sys.executable, "-m", "harness.cli", "sync", *args],
                          capture_output=True, text=True, env=env, timeout=600, cwd=REPO)


@pytest.fixture(scope="module")
def first_sync(fell_back: tuple[str, str, list[str]]) -> subprocess.CompletedProcess:
    local, server, _ = fell_back
    return _sync("--to", server, local=local)


def _artifacts(client, run_id: str, path: str | None = None) -> set[str]:  # noqa: ANN001
    out = set()
    for f in client.list_artifacts(run_id, path):
        out |= _artifacts(client, run_id, f.path) if f.is_dir else {f.path}
    return out


def _history(client, run_id: str, key: str) -> list[tuple]:  # noqa: ANN001
    return sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key))


def test_sync_copies_each_fallen_run_with_its_full_history(
        fell_back: tuple[str, str, list[str]], first_sync: subprocess.CompletedProcess) -> None:
    local, server, ids = fell_back
    assert first_sync.returncode == 0, first_sync.stderr
    assert f"synced 4 run(s) from {local} to {server}" in first_sync.stdout
    assert len([line for line in first_sync.stderr.splitlines() if " -> " in line]) == 4
    src, dst = _client(local), _client(server)
    target = {}
    for rid in ids:
        run = src.get_run(rid)
        assert run.data.tags[sync.SYNCED_TO_TAG] == server
        target[rid] = run.data.tags[sync.SYNCED_RUN_TAG]
    for rid in ids:
        mine, copy = src.get_run(rid), dst.get_run(target[rid])
        assert dst.get_experiment(copy.info.experiment_id).name == EXPERIMENT
        assert copy.info.run_name == mine.info.run_name
        assert (copy.info.status, copy.info.start_time, copy.info.end_time) == (
            mine.info.status, mine.info.start_time, mine.info.end_time)
        assert copy.data.params == mine.data.params
        assert copy.data.tags[sync.SYNCED_FROM_TAG] == rid
        for key in set(mine.data.tags) - {sync.SYNCED_RUN_TAG, sync.SYNCED_TO_TAG,
                                          "mlflow.parentRunId"}:
            assert copy.data.tags[key] == mine.data.tags[key], key
        if "mlflow.parentRunId" in mine.data.tags:  # remapped to the parent's copy
            assert copy.data.tags["mlflow.parentRunId"] == target[
                mine.data.tags["mlflow.parentRunId"]]
        assert set(copy.data.metrics) == set(mine.data.metrics)
        for key in mine.data.metrics:
            assert _history(dst, copy.info.run_id, key) == _history(src, rid, key), key
        assert _artifacts(dst, copy.info.run_id) == _artifacts(src, rid)
    parent, cell, train, broken = (dst.get_run(target[i]) for i in ids)
    assert "mlflow.parentRunId" not in parent.data.tags
    assert train.data.tags["mlflow.parentRunId"] == cell.info.run_id
    assert cell.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert broken.info.status == "FAILED"
    assert [m.step for m in dst.get_metric_history(train.info.run_id, "quality")] == [
        0, 1, 2, 3, 4]
    assert _artifacts(dst, train.info.run_id) == {"plan.json", "traces/trace.json",
                                                   "curves.png"}
    plan = Path(dst.download_artifacts(train.info.run_id, "plan.json")).read_text()
    assert plan == "plan"
    names = {r.info.run_name for r in dst.search_runs(
        [dst.get_experiment_by_name(EXPERIMENT).experiment_id])}
    assert names == {"suite", "cell", "train", "broken"}  # nothing meant for elsewhere


def test_a_second_sync_copies_nothing(fell_back: tuple[str, str, list[str]],
                                      first_sync: subprocess.CompletedProcess) -> None:
    local, server, _ = fell_back
    assert first_sync.returncode == 0, first_sync.stderr
    exp_id = _client(server).get_experiment_by_name(EXPERIMENT).experiment_id
    before = len(_client(server).search_runs([exp_id]))
    again = _sync("--to", server, local=local)
    assert again.returncode == 0, again.stderr
    assert "synced 0 run(s)" in again.stdout and "4 already there" in again.stdout
    assert len(_client(server).search_runs([exp_id])) == before


def test_a_bad_or_unreachable_uri_is_one_line_and_exit_code_2(
        fell_back: tuple[str, str, list[str]]) -> None:
    local, server, _ = fell_back
    for args, message in (
            (["--to", "localhost:5000"], "is not a tracking URI"),
            (["--to", "http://127.0.0.1:1"], "tracking server http://127.0.0.1:1 unreachable"),
            (["--to", server, "--from", "sqlite:////no/such/store.db"], "no such store"),
            (["--to", server, "--experiment", "no-such-experiment"], "no such experiment")):
        r = _sync(*args, local=local)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
