"""harness/metrics.py: keys formatted and parsed back, per-worker values selected and
aggregated, the lists derived from the schema."""

from __future__ import annotations

import pytest

from harness import metrics
from harness.metrics import (
    ACTION_TIME,
    BUBBLE_FRACTION,
    BUSY,
    CELL_STAT,
    LINK_BYTES,
    PEAK_MEMORY,
    SYSTEM_THROUGHPUT,
    THROUGHPUT,
    key,
    parse,
)

SAMPLE = {"worker": 12, "stage": 7, "src": 3, "dst": 10, "kind": "SF", "system": "torch-1f1b",
          "metric": "bubble_fraction", "stat": "_max"}


def test_every_metric_round_trips_through_its_key() -> None:
    for m in metrics.SCHEMA:
        fields = {f: SAMPLE[f] for f in m.fields}
        k = key(m.name, **fields)
        assert parse(k) == (m.name, fields), k
        assert m.match(k) == fields
    assert len({m.name for m in metrics.SCHEMA}) == len(metrics.SCHEMA)


def test_keys_with_numbers() -> None:
    assert key(BUSY, worker=0) == "busy_s_worker_0"
    assert key(BUBBLE_FRACTION, worker=15) == "bubble_fraction_worker_15"
    assert key(ACTION_TIME, kind="F", worker=3) == "action_s_F_worker_3"
    assert key(LINK_BYTES, src=1, dst=0) == "bytes_link_1_to_0"
    assert key(SYSTEM_THROUGHPUT, system="ddp") == "samples_per_s.ddp"
    assert key(CELL_STAT, metric=THROUGHPUT, stat="_min") == "throughput_samples_per_s_min"
    assert key(THROUGHPUT) == "throughput_samples_per_s"
    assert parse("action_s_wait_worker_10") == (ACTION_TIME, {"kind": "wait", "worker": 10})
    # thread use is logged field by field as thread_use.FIELDS reads it
    from pipedream_impl.runtime.thread_use import FIELDS
    assert [f"action_{f}" for f in FIELDS] == list(metrics.THREAD_USE)
    # the thread-use keys beside action_s_: each parses as itself, never as action_s
    for name in (metrics.ACTION_CPU, metrics.ACTION_SYS, metrics.ACTION_FAULTS,
                 metrics.ACTION_PREEMPTIONS):
        assert parse(key(name, kind="SF", worker=2)) == (name, {"kind": "SF", "worker": 2})
    assert parse("bytes_link_12_to_3") == (LINK_BYTES, {"src": 12, "dst": 3})
    # a run metric is itself, not its suite cell's median; the max over workers is no worker
    assert parse("peak_memory_bytes_max") == ("peak_memory_bytes_max", {})
    assert parse("peak_memory_bytes_max_max") == (CELL_STAT, {"metric": "peak_memory_bytes_max",
                                                              "stat": "_max"})
    assert parse("bubble_fraction") == (CELL_STAT, {"metric": BUBBLE_FRACTION, "stat": ""})
    for unknown in ("busy_s_worker_x", "busy_s_worker_", "bubble_fraction_worker_1_max",
                    "system/cpu_utilization_percentage", "loss"):
        assert parse(unknown) is None, unknown


def test_a_key_needs_its_fields_and_a_known_name() -> None:
    with pytest.raises(ValueError, match=r"takes the fields \['worker'\]"):
        key(BUSY)
    with pytest.raises(ValueError, match=r"takes the fields \['kind', 'worker'\]"):
        key(ACTION_TIME, worker=0)
    with pytest.raises(ValueError, match=r"takes the fields \[\]"):
        key(THROUGHPUT, worker=0)
    with pytest.raises(KeyError, match="no metric 'busy' in the schema"):
        key("busy", worker=0)
    with pytest.raises(ValueError, match="not per worker"):
        metrics.per_worker({}, THROUGHPUT)


RUN = {"throughput_samples_per_s": 100.0, "busy_s_worker_1": 3.0, "busy_s_worker_0": 1.5,
       "bubble_fraction_worker_1": 0.5, "bubble_fraction_worker_0": 0.25,
       "bubble_fraction_max": 0.9, "action_s_F_worker_0": 0.75, "action_s_B_worker_0": 0.5,
       "action_s_F_worker_1": 1.25, "peak_memory_bytes_max": 300,
       "peak_memory_bytes_worker_0": 300, "peak_memory_bytes_worker_1": 200}


def test_per_worker_values_in_the_runs_order_and_aggregated_by_the_schema() -> None:
    assert metrics.per_worker(RUN, BUBBLE_FRACTION) == {1: 0.5, 0: 0.25}
    assert list(metrics.per_worker(RUN, BUSY)) == [1, 0]
    assert metrics.per_worker(RUN, ACTION_TIME, kind="F") == {0: 0.75, 1: 1.25}
    assert metrics.select(RUN, ACTION_TIME, worker=0) == [
        ({"kind": "F", "worker": 0}, 0.75), ({"kind": "B", "worker": 0}, 0.5)]
    assert metrics.aggregate(RUN, BUSY) == 4.5  # sum
    assert metrics.aggregate(RUN, BUBBLE_FRACTION) == 0.375  # mean
    assert metrics.aggregate(RUN, PEAK_MEMORY) == 300  # max
    assert metrics.aggregate(RUN, ACTION_TIME, kind="F") == 2.0
    assert metrics.mean_bubble(RUN) == 0.375
    assert metrics.mean_bubble({"busy_s_worker_0": 1.0}) is None
    assert metrics.aggregate({}, BUSY) is None


def test_the_lists_derived_from_the_schema() -> None:
    from harness.reporting import results, tracking

    assert metrics.EPOCH_METRICS == ("epoch_time_s", "samples_per_s", "train_loss", "quality",
                                     "eval_time_s")
    assert metrics.RUN_METRICS == ("throughput_samples_per_s", "steady_samples_per_s",
                                   "steady_window_spread", "steady_windows",
                                   "cpu_s_per_sample", "final_quality",
                                   "best_quality", "total_time_s", "epochs_run",
                                   "bytes_communicated_per_sample", "peak_memory_bytes_max")
    assert metrics.TARGET_METRICS == ("time_to_target_s", "epochs_to_target")
    assert (tracking.EPOCH_METRICS, tracking.RUN_METRICS) == (metrics.EPOCH_METRICS,
                                                              metrics.RUN_METRICS)
    assert tracking.peak_memory_key(2) == "peak_memory_bytes_worker_2"
    assert results.METRICS == {"throughput_samples_per_s": True,
                               "throughput_per_reference": True,
                               "steady_samples_per_s": True, "steady_per_reference": True,
                               "reference_iterations_per_s": None,
                               "cpu_s_per_sample": False,
                               "cpu_reference_per_sample": False, "time_to_target_s": False,
                               "epochs_to_target": False, "peak_memory_bytes_max": False,
                               "bubble_fraction": False}
    per_worker = {m.name: m.aggregate for m in metrics.SCHEMA if m.per_worker}
    assert per_worker == {"peak_memory_bytes": "max", "busy_s": "sum", "action_s": "sum",
                          "action_cpu_s": "sum", "action_sys_s": "sum", "action_faults": "sum",
                          "action_preemptions": "sum", "stash_weight_bytes": "max",
                          "stash_activation_bytes": "max", "idle_s": "sum",
                          "bubble_fraction": "mean"}
    assert all(m.unit and m.meaning.endswith(".") for m in metrics.SCHEMA)


def test_drift_cancelled_figures_count_in_reference_iterations() -> None:
    # a machine at half speed: the loop runs half the iterations per second, a sample
    # takes half the throughput and twice the CPU seconds; the cancelled figures hold
    for raw, cancelled in metrics.DRIFT_PAIRS.items():
        assert metrics.get(raw).higher_is_better == metrics.get(cancelled).higher_is_better
    fast = {n: metrics.cancel_drift(n, v, 40.0) for n, v in
            (("throughput_samples_per_s", 2000.0), ("cpu_s_per_sample", 0.001))}
    slow = {n: metrics.cancel_drift(n, v, 20.0) for n, v in
            (("throughput_samples_per_s", 1000.0), ("cpu_s_per_sample", 0.002))}
    assert fast == slow == {"throughput_samples_per_s": 50.0, "cpu_s_per_sample": 0.04}
    assert metrics.cancel_drift("cpu_s_per_sample", None, 20.0) is None
    assert metrics.cancel_drift("steady_samples_per_s", 10.0, 0.0) is None
    assert metrics.cancel_drift("steady_samples_per_s", float("nan"), 3.0) is None
