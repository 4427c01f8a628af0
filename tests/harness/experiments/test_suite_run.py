"""harness/experiments/suite_run.py: what a suite keeps of each repeat (its metrics,
counters and per-worker numbers), read through the metrics schema."""

from __future__ import annotations

import json
from types import SimpleNamespace

from harness.experiments.suite_run import _measure, _per_worker

FINAL = {"throughput_samples_per_s": 40.0, "peak_memory_bytes_max": 300,
         "bytes_communicated_per_sample": 96.0, "actions_per_epoch": 12.0,
         "busy_s_worker_1": 3.0, "bubble_fraction_worker_1": 0.5,
         "busy_s_worker_0": 1.0, "bubble_fraction_worker_0": 0.25,
         "peak_memory_bytes_worker_0": 300, "peak_memory_bytes_worker_1": 200}


def test_a_repeat_is_kept_as_the_suites_metrics_and_counters() -> None:
    summary = SimpleNamespace(final_metrics=FINAL, throughput=40.0, time_to_target_s=None,
                              epochs_to_target=None, num_parameters=7,
                              steady=SimpleNamespace(samples_per_s=48.0), cpu_per_sample=0.5,
                              epochs=[SimpleNamespace(steps=4)])
    measured, counters = _measure(summary, 8.0)  # the drift reference ran 8 iterations/s
    assert measured == {"throughput_samples_per_s": 40.0, "time_to_target_s": None,
                        "reference_iterations_per_s": 8.0, "throughput_per_reference": 5.0,
                        "steady_samples_per_s": 48.0, "steady_per_reference": 6.0,
                        "cpu_s_per_sample": 0.5,
                        "epochs_to_target": None, "peak_memory_bytes_max": 300,
                        "bubble_fraction": 0.375}
    assert counters == {"bytes_per_sample": 96.0, "num_parameters": 7, "steps_per_epoch": 4,
                        "actions_per_epoch": 12.0}


def test_per_worker_numbers_keep_the_runs_order() -> None:
    out = _per_worker(FINAL)
    assert json.dumps(out) == ('{"peak_memory_bytes": {"0": 300, "1": 200}, '
                               '"bubble_fraction": {"1": 0.5, "0": 0.25}}')
    assert _per_worker({"throughput_samples_per_s": 1.0}) == {"peak_memory_bytes": {},
                                                              "bubble_fraction": {}}
