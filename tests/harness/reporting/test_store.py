"""harness/reporting/store.py: training runs read back from MLflow's search results as
comparison records and rows (the bubble: the mean of the workers' bubble fractions); a
suite's history read from a directory of result files or from a sqlite MLflow store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from core.errors import UserInputError
from harness.reporting.results import SCHEMA
from harness.reporting.store import (
    COMPARE_COLUMNS,
    compare_records,
    compare_rows,
    dir_history,
    file_history,
    store_history,
)


def test_runs_become_records_and_rows() -> None:
    frame = pd.DataFrame([
        {"run_id": "a" * 32, "start_time": "2024-05-01 10:00:00.5", "params.system": "gpipe",
         "params.workload": "vgg16", "params.scale": "tiny", "params.workers": "2",
         "params.config": "1-1", "metrics.throughput_samples_per_s": 120.4,
         "metrics.epochs_run": 3.0, "metrics.best_quality": 0.51234,
         "metrics.bytes_communicated_per_sample": 2048.0,
         "metrics.peak_memory_bytes_max": 3 * 2**20,
         "metrics.bubble_fraction_worker_0": 0.25, "metrics.bubble_fraction_worker_1": 0.5,
         "metrics.busy_s_worker_0": 9.0},
        {"run_id": "b" * 32, "start_time": "2024-05-01 11:00:00", "params.system": "single",
         "params.workload": "vgg16", "params.scale": "tiny", "params.workers": "1",
         "metrics.throughput_samples_per_s": 60.0, "metrics.time_to_target_s": 12.34,
         "metrics.epochs_run": 2.0, "metrics.bubble_fraction_worker_0": math.nan},
    ])
    a, b = compare_records(frame)
    assert a["bubble_fraction"] == 0.375 and b["bubble_fraction"] is None
    assert (a["time_to_target_s"], b["time_to_target_s"]) == (None, 12.34)
    assert (a["config"], b["config"]) == ("1-1", "1")
    rows = compare_rows([a, b])
    assert all(len(r) == len(COMPARE_COLUMNS) for r in rows)
    assert rows[0][6:13] == ("120", "not reached", "3", "0.5123", "2.0 KiB", "3.0 MiB", "38%")
    assert rows[1][6:13] == ("60", "12.3", "2", "", "", "", "-")


def _result(day: int, suite: str = "nightly", machine: str = "m", sha: str = "a",
            plant: dict | None = None) -> dict:
    return {"schema": SCHEMA, "suite": {"name": suite, "plant": plant or {}}, "cells": [],
            "created": f"2000-01-{day:02d}T00:00:00+00:00",
            "environment": {"machine": machine, "git_sha": sha}}


def test_a_history_from_files_is_the_last_n_before_the_result(tmp_path: Path) -> None:
    """Nights 1-5 written in a scrambled name order, tonight's copy and a duplicate among
    them, and results of another suite, another machine, a planted slowdown and a later
    night: the history of night 5 is the nights before it, each once, oldest first, cut to
    the last n."""
    files = {"z.json": _result(1), "b.json": _result(3), "a.json": _result(2),
             "a-copy.json": _result(2), "y.json": _result(4), "tonight-copy.json": _result(5),
             "suite.json": _result(4, suite="smoke"), "machine.json": _result(4, machine="n"),
             "planted.json": _result(4, sha="p", plant={"pipedream": "slow:*:*:1.2"}),
             "later.json": _result(6)}
    for name, r in files.items():
        (tmp_path / name).write_text(json.dumps(r))
    tonight = _result(5)
    days = [r["created"][8:10] for r in file_history(tonight, 3, str(tmp_path))]
    assert days == ["02", "03", "04"]
    assert [r["created"][8:10] for r in file_history(tonight, 10, str(tmp_path))] == \
        ["01", "02", "03", "04"]
    assert file_history(tonight, 0, str(tmp_path)) == []
    # the same time at another commit is another result, not tonight's copy
    assert len(file_history(_result(5, sha="b"), 10, str(tmp_path))) == 5
    # the dashboard's nights: the newest of the suite and its history
    assert [r["created"][8:10] for r in dir_history(str(tmp_path), None, 3)] == \
        ["04", "05", "06"]
    assert [r["suite"]["name"] for r in dir_history(str(tmp_path), "smoke", 30)] == ["smoke"]
    assert dir_history(str(tmp_path), "gpu", 30) == []


def test_a_file_that_is_no_suite_result_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_result(1)))
    (tmp_path / "notes.json").write_text(json.dumps({"schema": SCHEMA}))
    with pytest.raises(UserInputError, match="notes.json: a suite result without"):
        file_history(_result(2), 1, str(tmp_path))
    (tmp_path / "notes.json").write_text(json.dumps({**_result(1), "created": 5}))
    with pytest.raises(UserInputError, match="notes.json: a suite result without"):
        file_history(_result(2), 1, str(tmp_path))
    (tmp_path / "notes.json").write_text("[1, 2]")
    with pytest.raises(UserInputError, match="notes.json"):
        file_history(_result(2), 1, str(tmp_path))


def test_the_dashboard_nights_from_the_store_leave_planted_runs_out(mlflow_uri: str) -> None:
    """Nights 1-3 of the suite in the store, then a planted run started last and measured
    latest, and a night of another suite: the dashboard's nights are 1-3, oldest first;
    with a shorter history, the newest of them. Without the planted rule, the planted run
    would be the night shown."""
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    exp = client.create_experiment("store-history-test")
    runs = [(_result(2), "nightly"), (_result(1), "nightly"), (_result(3), "nightly"),
            (_result(9, sha="p", plant={"pipedream": "slow:*:*:1.2"}), "nightly"),
            (_result(8, suite="smoke"), "smoke")]
    for i, (result, suite) in enumerate(runs):  # started in this order, a second apart
        run = client.create_run(exp, start_time=1_000_000 + 1000 * i,
                                tags={"pipebench.kind": "suite", "pipebench.suite": suite,
                                      "pipebench.machine": "m"})
        client.log_dict(run.info.run_id, result, "suite.json")
        client.set_terminated(run.info.run_id, "FINISHED")
    nights = store_history("store-history-test", "nightly", 10)
    assert [(r["created"][8:10], r["suite"]["plant"]) for r in nights] == \
        [("01", {}), ("02", {}), ("03", {})]
    assert [r["created"][8:10] for r in store_history("store-history-test", "nightly", 1)] \
        == ["03"]
    # the last n started (3, then 1), shown by when each was made
    assert [r["created"][8:10] for r in store_history("store-history-test", "nightly", 2)] \
        == ["01", "03"]
    # the suite last run, when none is named
    assert [r["suite"]["name"] for r in store_history("store-history-test", None, 10)] == \
        ["smoke"]
    assert store_history("no-such-experiment", None, 10) == []
