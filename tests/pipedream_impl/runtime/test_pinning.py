"""pinning.py: which cores each worker takes, and that a pinned process's threads (those it
had and those it starts later) run only there.

Why: ``PIPEBENCH_PIN`` is measured by ``scripts/env_ab.py`` (issue 24); a rule that gave two
workers one core, or left gloo's threads unpinned, would measure something else. The
cores are checked against the rule written out by hand; the pinning against the kernel's
own record of each thread's mask (/proc/PID/task/TID/status, ``Cpus_allowed_list``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipedream_impl.runtime.pinning import PIN_ENV, cores_for, pinning

_REPO = Path(__file__).resolve().parents[3]


def test_each_local_rank_takes_its_own_slice_of_the_cores() -> None:
    cores = [0, 1, 2, 3, 4, 5]
    assert [cores_for(i, 1, 2, cores) for i in range(2)] == [{0}, {1}]
    assert [cores_for(i, 2, 3, cores) for i in range(3)] == [{0, 1}, {2, 3}, {4, 5}]
    assert cores_for(1, 1, 2, [3, 7]) == {7}  # the launcher's mask, in order


def test_nothing_is_pinned_where_the_world_does_not_fit() -> None:
    assert cores_for(0, 1, 4, [0, 1]) == set()  # 4 workers on 2 cores
    assert cores_for(0, 2, 2, [0, 1, 2]) == set()  # 2 x 2 threads on 3 cores
    assert cores_for(2, 1, 2, [0, 1, 2, 3]) == set()  # not a rank of this world


def test_the_switch_reads_only_zero_or_one(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv(PIN_ENV, raising=False)
    assert pinning() is False
    monkeypatch.setenv(PIN_ENV, "1")
    assert pinning() is True
    monkeypatch.setenv(PIN_ENV, "yes")
    with pytest.raises(ValueError, match="use 1"):
        pinning()


_CHILD = """
import os, threading
from pathlib import Path
from pipedream_impl.runtime.pinning import pin
done = threading.Event()
t0 = threading.Thread(target=done.wait); t0.start()      # a thread it had already
got = pin({rank}, 1, 2)
t1 = threading.Thread(target=done.wait); t1.start()      # one it starts later
masks = set()
for task in Path("/proc/self/task").iterdir():
    for line in (task / "status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            masks.add(line.split()[1])
done.set(); t0.join(); t1.join()
print(sorted(got), sorted(masks))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin to")
@pytest.mark.parametrize("rank", [0, 1])
def test_every_thread_of_a_pinned_worker_runs_on_its_core(rank: int) -> None:
    core = sorted(os.sched_getaffinity(0))[rank]
    env = dict(os.environ, **{PIN_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", _CHILD.format(rank=rank)], env=env,
                         capture_output=True, text=True, check=True).stdout.split("]", 1)
    assert out[0] + "]" == f"[{core}]"
    assert out[1].strip() == f"['{core}']"  # all three threads: one mask, that core


def test_a_world_that_does_not_fit_is_not_pinned_and_says_so() -> None:
    env = dict(os.environ, **{PIN_ENV: "1", "LOCAL_WORLD_SIZE": "64"})
    done = subprocess.run([sys.executable, "-c", _CHILD.format(rank=0)], env=env,
                          capture_output=True, text=True, check=True)
    assert done.stdout.startswith("[]")
    assert "not pinned: 64 worker(s) x 1 thread(s) do not fit" in done.stderr


def test_unset_pins_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if k != PIN_ENV}
    out = subprocess.run([sys.executable, "-c", _CHILD.format(rank=0)], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("[]")


@pytest.mark.multiprocess
@pytest.mark.cli
@pytest.mark.parametrize("system", ["pipedream", "ddp"])
def test_every_worker_of_a_run_goes_through_the_pinning(system: str) -> None:
    """worker._serve calls the rule in every CPU worker: told that one worker more than
    the CPUs shares the machine, each of the run's two workers says it is not pinned (a
    worker that skipped the call would say nothing)."""
    crowd = len(os.sched_getaffinity(0)) + 1  # one worker more than the CPUs
    env = dict(os.environ, **{PIN_ENV: "1", "LOCAL_WORLD_SIZE": str(crowd),
                              "PIPEBENCH_TRACKING": "off"})
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--workload", "vgg16",
                           "--system", system, "--workers", "2", "--threads", "1",
                           "--device", "cpu", "--epochs", "1", "--max-steps", "2", "--quiet"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=_REPO)
    assert done.returncode == 0, done.stderr
    said = [ln for ln in done.stderr.splitlines() if f"not pinned: {crowd} worker(s)" in ln]
    assert len(said) == 2, done.stderr
