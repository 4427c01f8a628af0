"""harness/experiments/runner.py: the metrics a run logs at the end, by name and value,
every key one of the schema's (harness/metrics.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness import metrics
from harness.experiments.pipeline_trainer import PipelineMetrics
from harness.experiments.runner import _final_metrics
from harness.experiments.training import EpochStats, RunSummary


def _summary(reached: bool) -> RunSummary:
    s = RunSummary(config=None, metric="top1", target=0.5)
    # completions: 3 windows at 16 / 0.5 s, then 4 at 16 / 0.25 s (minibatches of 16)
    s.epochs = [EpochStats(1.0, 4, 64, 2.0, 48, 1.5, [0.0, 0.5, 1.0, 1.5], cpu_s=4.0),
                EpochStats(2.0, 4, 64, 2.0, 64, 2.0, [10.0, 10.25, 10.5, 10.75, 11.0],
                           cpu_s=6.0)]
    s.batch_size = 16
    s.qualities, s.elapsed_s, s.total_time_s = [0.6, 0.3], [2.5, 5.0], 5.5
    if reached:
        s.time_to_target_s, s.epochs_to_target = 2.5, 1
    return s


def _trainer() -> SimpleNamespace:
    return SimpleNamespace(metrics=PipelineMetrics(
        bytes_sent=12800, samples=128, busy={0: 1.5, 1: 3.0}, idle={0: 0.5, 1: 1.0},
        action_s={0: {"SF": 0.25, "F": 1.25}, 1: {"wait": 1.0}},
        action_use={0: {"F": [1.0, 0.125, 7.0, 2.0]}},
        peak_memory={0: 100, 1: 300}, stash_weights={0: 10, 1: 0},
        stash_activations={0: 1, 1: 2}, links={(0, 1): 500, (1, 0): 50}, actions=99,
        events_dropped=3))


@pytest.mark.parametrize("reports_idle", [True, False])
def test_a_pipeline_run_logs_the_schemas_keys(reports_idle: bool) -> None:
    cfg = SimpleNamespace(definition=SimpleNamespace(multi_process=True,
                                                     reports_idle=reports_idle))
    final = _final_metrics(cfg, _trainer(), _summary(True), torch.device("cpu"),
                           SimpleNamespace(higher_is_better=True))
    idle = {"idle_s_worker_0": 0.5, "bubble_fraction_worker_0": 0.25} if reports_idle else {}
    idle1 = {"idle_s_worker_1": 1.0, "bubble_fraction_worker_1": 0.25} if reports_idle else {}
    assert list(final.items()) == list({
        # steady: the windows' samples over their spans, (3 + 4) x 16 / (1.5 + 1.0) s
        "throughput_samples_per_s": 32.0, "steady_samples_per_s": 112 / 2.5,
        "steady_window_spread": 0.5, "steady_windows": 7, "cpu_s_per_sample": 10 / 128,
        "final_quality": 0.3, "best_quality": 0.6,
        "total_time_s": 5.5, "epochs_run": 2, "bytes_communicated_per_sample": 100.0,
        "busy_s_worker_0": 1.5, **idle, "action_s_F_worker_0": 1.25,
        "action_s_SF_worker_0": 0.25, "action_cpu_s_F_worker_0": 1.0,
        "action_sys_s_F_worker_0": 0.125, "action_faults_F_worker_0": 7.0,
        "action_preemptions_F_worker_0": 2.0, "stash_weight_bytes_worker_0": 10,
        "stash_activation_bytes_worker_0": 1,
        "busy_s_worker_1": 3.0, **idle1, "action_s_wait_worker_1": 1.0,
        "stash_weight_bytes_worker_1": 0, "stash_activation_bytes_worker_1": 2,
        "bytes_link_0_to_1": 500, "bytes_link_1_to_0": 50, "actions_per_epoch": 49.5,
        "trace_events_dropped": 3, "peak_memory_bytes_max": 300,
        "peak_memory_bytes_worker_0": 100, "peak_memory_bytes_worker_1": 300,
        "time_to_target_s": 2.5, "epochs_to_target": 1}.items())
    assert all(metrics.parse(k) is not None for k in final)
    assert metrics.mean_bubble(final) == (0.25 if reports_idle else None)


def test_a_one_process_run_that_missed_its_target() -> None:
    cfg = SimpleNamespace(definition=SimpleNamespace(multi_process=False, reports_idle=False))
    final = _final_metrics(cfg, None, _summary(False), torch.device("cpu"),
                           SimpleNamespace(higher_is_better=False))
    assert list(final) == [*metrics.RUN_METRICS, "peak_memory_bytes_worker_0"]
    assert (final["best_quality"], final["bytes_communicated_per_sample"]) == (0.3, 0.0)
    assert final["peak_memory_bytes_max"] == final["peak_memory_bytes_worker_0"] > 0


def test_stage_times_predicted_and_measured_per_minibatch() -> None:
    """Closed forms: predicted = the stage's layer times over its replicas; measured = the
    stage's workers' compute seconds (not sends, receives, all-reduces) per minibatch over
    its replicas."""
    from harness.experiments import stage_times

    layer_ms = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert stage_times.predict(layer_ms, (1, 2), ((0, 3), (3, 5))) == [6.0, 7.0]
    action_s = {0: {"F": 0.5, "B": 1.0, "U": 0.1, "SF": 9.0, "RB": 9.0},
                1: {"F": 1.0, "B": 1.5, "A": 9.0}, 2: {"I": 0.5, "W": 0.5, "U": 0.5}}
    placement = {0: (0, 0), 1: (1, 0), 2: (1, 1)}
    got = stage_times.measure(action_s, placement, (1, 2), minibatches=100)
    assert got == pytest.approx({0: 16.0, 1: 20.0})  # 1.6 s / 100; 4.0 s / 100 / 2
    keys = stage_times.stage_metrics([6.0, 7.0], got)
    assert keys == {"compute_ms_measured_stage_0": got[0], "compute_ms_measured_stage_1": got[1],
                    "compute_ms_predicted_stage_0": 6.0, "compute_ms_predicted_stage_1": 7.0}
    assert all(metrics.parse(k) is not None for k in keys)
    assert "stage 1 7.0 -> 20.0 ms (+186%)" in stage_times.gap_note([6.0, 7.0], got)
    assert "predicted" not in stage_times.gap_note(None, got)
