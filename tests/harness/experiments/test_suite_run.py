"""harness/experiments/suite_run.py: what a suite keeps of each repeat (its metrics,
counters and per-worker numbers), read through the metrics schema."""

from __future__ import annotations

import json
from types import SimpleNamespace

from harness.experiments.suite_run import _measure, _per_worker
from harness.paths import REPO

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
    # the drift reference ran 8 iterations/s; the drift-cancelled twins come with the
    # round's reference when every round has run (test_results)
    measured, counters = _measure(summary, 8.0)
    assert measured == {"throughput_samples_per_s": 40.0, "time_to_target_s": None,
                        "reference_iterations_per_s": 8.0, "steady_samples_per_s": 48.0,
                        "cpu_s_per_sample": 0.5, "epochs_to_target": None,
                        "peak_memory_bytes_max": 300, "bubble_fraction": 0.375}
    assert counters == {"bytes_per_sample": 96.0, "num_parameters": 7, "steps_per_epoch": 4,
                        "actions_per_epoch": 12.0}


def test_per_worker_numbers_keep_the_runs_order() -> None:
    out = _per_worker(FINAL)
    assert json.dumps(out) == ('{"peak_memory_bytes": {"0": 300, "1": 200}, '
                               '"bubble_fraction": {"1": 0.5, "0": 0.25}}')
    assert _per_worker({"throughput_samples_per_s": 1.0}) == {"peak_memory_bytes": {},
                                                              "bubble_fraction": {}}


def test_a_group_plans_on_the_suites_committed_profile_and_throughput_runs_straight(
        tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """With ``layout_profiles`` no profile is measured (the layouts are the same every
    night); throughput cells run straight splits (bench's rule: PipeDream too, one stage
    per worker), the several-stages-per-worker peers workers x 2 stages; time-to-target
    PipeDream runs the planner's plan."""
    import dataclasses
    from pathlib import Path

    from harness.experiments import suite_run
    from harness.experiments.suite import Cell, load_suite

    def measured(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a profile was measured")

    monkeypatch.setattr("pipedream_impl.profiling.profiler.profile_workload", measured)
    # the committed profile with every activation 1000x as large: the planner then
    # replicates (one stage on both workers), which a throughput cell must not run
    prof = json.loads((REPO / "suites/profiles/vgg16-tiny-b32-cpu.json").read_text())
    for layer in prof["layers"]:
        layer["activation_bytes"] = [1000 * a for a in layer["activation_bytes"]]
    (tmp_path / "vgg16-tiny-b32-cpu.json").write_text(json.dumps(prof))
    suite = dataclasses.replace(load_suite("smoke"), layout_profiles=str(tmp_path))
    cell = Cell("vgg16", "pipedream", 2, "tiny", "throughput", 1, 1, True, None, None)
    group = suite_run._Group(cell, suite, "e", tmp_path / "g")

    def stages(system: str, mode: str = "throughput") -> list[tuple[int, int]]:
        c = Cell("vgg16", system, 2, "tiny", mode, 1, 1, True, None, None)
        plan = group.config(c).pipeline.plan
        return [tuple(s["replicas"] for s in json.loads(Path(plan).read_text())["stages"])]

    assert stages("pipedream") == stages("gpipe") == [(1, 1)]
    assert stages("torch-zbv") == [(1, 1, 1, 1)]
    planned = json.loads(Path(group.plans["planned"]).read_text())
    assert stages("pipedream", "time-to-target") == [
        tuple(s["replicas"] for s in planned["stages"])] == [(2,)]


def test_a_failed_cell_note_names_the_worker_and_the_error() -> None:
    from harness.experiments.suite_run import failure_note

    text = ("worker rank 1 (stage 1, F0 of epoch 0) failed:\nTraceback (most recent call "
            "last):\n  File \"x.py\", line 3, in f\n\nRuntimeError: shapes differ\n")
    assert failure_note(text) == ("worker rank 1 (stage 1, F0 of epoch 0) failed: "
                                  "RuntimeError: shapes differ")
    assert failure_note("one line") == "one line"
    assert failure_note("") == ""
