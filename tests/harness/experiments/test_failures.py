"""Failures end a run cleanly: a worker that raises, is SIGKILLed or stalls at a chosen action
of a 2-worker pipedream, gpipe or horovod run ends the job within 30 s of the epoch's start
(so within 30 s of the fault), with the rank, its stage and its action named, no process
left behind and the MLflow run FAILED with what was logged before it.

The faults come from the fault-injection switch (pipedream_impl/runtime/faults.py); the
stall is caught by the launcher's watchdog (a 5 s stall timeout here)."""

from __future__ import annotations

import os

import psutil
import pytest

from harness.config import RunConfig
from harness.experiments.runner import run
from harness.reporting.progress import quiet
from pipedream_impl.runtime.faults import Fault
from pipedream_impl.runtime.launcher import PipelineFailure

BOUND_S = 30.0
# what each fault must leave in the message (besides the rank and its action)
SAYS = {"raise": "injected failure at F3 of epoch 0", "kill": "",
        "stall": "made no progress for"}


def _children() -> set[str]:
    """Live child processes of this test process (multiprocessing's resource tracker and
    fork server, one per process for its life, are not workers; the workers forked from
    the server, its children, carry its command line and are)."""
    out = set()
    me = os.getpid()
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            server = p.ppid() == me and "forkserver" in cmd
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in cmd \
                    and not server:
                out.add(f"{p.pid} {cmd}")
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["raise", "kill", "stall"])
@pytest.mark.parametrize("system", ["pipedream", "gpipe", "horovod"])
def test_a_fault_ends_the_run_naming_the_rank(system: str, kind: str, mlflow_uri: str) -> None:
    import mlflow

    before = _children()
    experiment = f"fault-{system}-{kind}"
    cfg = RunConfig.from_flags(system=system, workload="vgg16", workers=2, threads=1, epochs=1,
                    max_steps_per_epoch=6, config=None if system == "horovod" else "1-1",
                    fault=Fault(kind, 1, "F", 3), stall_timeout_s=5.0, timeout_s=60.0,
                    experiment=experiment)
    with pytest.raises(PipelineFailure) as info:
        run(cfg, quiet())
    message = str(info.value)
    assert info.value.epoch_elapsed_s is not None and info.value.epoch_elapsed_s < BOUND_S
    stage = 0 if system == "horovod" else 1
    # the rank, its stage and the action it was in (or had just finished when killed)
    assert f"rank 1 (stage {stage}, " in message, message
    assert "F3 of epoch 0" in message or (kind == "kill" and "of epoch 0" in message), message
    assert SAYS[kind] in message, message
    if kind == "kill":
        assert "killed by SIGKILL" in message or "connection to the launcher broke" in message
    assert _children() <= before, "worker processes left behind"
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    (logged,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert logged.info.status == "FAILED"
    assert logged.data.params["system"] == system  # logged before the failure, kept
