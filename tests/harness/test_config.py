"""Bad settings of a run (run, compare-run, bench, reproduce validation): each refused in
one clear line by RunConfig's own checks or, for what needs the model or a file, by the
edge check every run passes before it starts (``check_run``)."""

from __future__ import annotations

import os

import pytest

from core.errors import UserInputError
from harness.config import RunConfig
from harness.experiments.layout import check_run

RUN_CASES = [
    ({"lr": -1.0}, "--lr must be a positive number (got -1.0)"),
    ({"lr": float("nan")}, "--lr must be a positive number (got nan)"),
    ({"lr": float("inf")}, "(got inf)"),
    ({"timeout_s": 0.0}, "--timeout must be a positive number (got 0.0)"),
    ({"timeout_s": float("nan")}, "--timeout must be a positive number"),
    ({"target": float("nan")}, "--target must be a finite number"),
    ({"seed": -1}, "--seed must be 0 or more"),
    ({"max_steps_per_epoch": 0}, "--max-steps must be at least 1"),
    ({"system": "gpipe", "workers": 2, "microbatches": 0}, "--microbatches must be at least"),
    ({"system": "pipedream", "workers": 2, "in_flight": 0}, "--in-flight must be at least"),
    ({"system": "pipedream", "workers": 1000}, "--workers 1000 would start 1000 worker "
                                               "processes"),
    ({"system": "gpipe", "workers": 5, "workload": "s2vt"}, "s2vt/tiny has only 4 layers"),
    ({"system": "pipedream", "workers": 6, "config": "1-1-1-1-1-1", "workload": "s2vt"},
     "--config 1-1-1-1-1-1 asks for 6 pipeline stages"),
    ({"system": "pipedream", "workers": 2, "config": "2-1"},
     "needs 3 workers but --workers is 2"),
    ({"system": "pipedream", "workers": 2, "config": "0-2"}, "every stage needs >= 1"),
    ({"system": "horovod", "workers": 2, "config": "1-1"}, "replicates the whole model"),
]


@pytest.mark.parametrize("changes, message", RUN_CASES)
def test_run_configs_out_of_range(changes: dict, message: str) -> None:
    """Each is refused by the config's own checks or, for what needs the model or a file,
    by the edge check every run passes before it starts (``check_run``)."""
    kw = {"system": "single", "workload": "vgg16", **changes}
    with pytest.raises(UserInputError) as e:
        check_run(RunConfig.from_flags(**kw))
    assert message in str(e.value)


def test_the_worker_cap_says_how_to_override_it(monkeypatch: pytest.MonkeyPatch) -> None:
    cap = 8 * (os.cpu_count() or 1)
    with pytest.raises(UserInputError, match=f"the limit is {cap}.*PIPEBENCH_MAX_WORKERS="):
        RunConfig.from_flags(system="horovod", workload="vgg16", workers=cap + 1)
    monkeypatch.setenv("PIPEBENCH_MAX_WORKERS", str(cap + 1))
    cfg = RunConfig.from_flags(system="horovod", workload="vgg16", workers=cap + 1)
    assert cfg.workers == cap + 1
