"""harness/experiments/compare.py and bench.py: one rule for every compared system's
config, and the benchmark's targets read off the right rows."""

from __future__ import annotations

import json

import pytest

from core.errors import UserInputError
from harness.config import RunConfig
from harness.experiments.bench import checks
from harness.experiments.compare import system_config


def test_bench_targets_compare_the_right_rows() -> None:
    rates = {"pipedream": 120.0, "gpipe": 94.0, "torch-gpipe": 100.0, "torch-1f1b": 110.0,
             "pipedream-flush": 105.0, "deepspeed-pipe": 100.0, "torch-zbv": 300.0,
             "ddp": 500.0}
    got = {what: ok for what, ok, _ in checks(rates)}
    assert got == {"gpipe >= 0.95x torch-gpipe": False,  # 0.94
                   "pipedream-flush >= 0.95x torch-1f1b": True,  # 0.955
                   "pipedream-flush >= 0.95x deepspeed-pipe": True,
                   "pipedream >= 1.1x every flush pipeline": False}  # torch-zbv flushes too
    rates.update(gpipe=95.0, pipedream=340.0, **{"pipedream-flush": 104.0})
    got = {what: ok for what, ok, _ in checks(rates)}
    assert got == {"gpipe >= 0.95x torch-gpipe": True,
                   "pipedream-flush >= 0.95x torch-1f1b": False,  # 0.945
                   "pipedream-flush >= 0.95x deepspeed-pipe": True,
                   "pipedream >= 1.1x every flush pipeline": True}  # 340 / 300


def test_one_rule_gives_every_compared_system_its_config(tmp_path) -> None:  # noqa: ANN001
    """compare-run and bench share system_config: single gets one worker and the whole
    thread budget, data parallelism no plan, every pipeline the plan."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"workers": 2, "predicted": {}, "stages": [
        {"layers": [0, 20], "replicas": 1, "ranks": [0], "predicted_time_s": 0},
        {"layers": [20, 40], "replicas": 1, "ranks": [1], "predicted_time_s": 0}]}))
    plan = str(plan)
    base = RunConfig.from_flags(
        system="pipedream", workload="vgg16", scale="tiny", workers=2, threads=1)
    single = system_config(base, "single", plan, batch_size=8)
    assert (single.workers, single.threads, single.data.batch_size) == (1, 2, 8)
    assert system_config(base, "ddp", plan).pipeline.plan is None
    for system in ("gpipe", "torch-1f1b", "pipedream", "horovod"):
        cfg = system_config(base, system, plan)
        assert (cfg.workers, cfg.threads) == (2, 1)
        assert cfg.pipeline.plan == (None if system == "horovod" else plan)
    with pytest.raises(UserInputError, match="unknown system 'mystery'"):
        system_config(base, "mystery", None)
