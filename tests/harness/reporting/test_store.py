"""harness/reporting/store.py: training runs read back from MLflow's search results as
comparison records and rows (the bubble: the mean of the workers' bubble fractions)."""

from __future__ import annotations

import math

import pandas as pd

from harness.reporting.store import COMPARE_COLUMNS, compare_records, compare_rows


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
