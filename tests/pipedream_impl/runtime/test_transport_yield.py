"""pipedream_impl/runtime/transport_yield.py on real gloo processes: the switch puts gloo's
transport threads, and only them, at nice 19 or under ``SCHED_IDLE`` (``auto``, the default:
under ``SCHED_IDLE`` where the workers crowd the cores, else untouched), as the kernel then
reports for each thread, and back to the kernel's default; a value it does not know is
refused. Unset, nothing is touched unless the workers crowd the cores."""

from __future__ import annotations

import datetime
import os

import pytest
import torch.distributed as dist

from pipedream_impl.runtime import transport_yield
from pipedream_impl.runtime.transport_yield import THREAD_NAME, TRANSPORT_YIELD_ENV
from tests.gloo_ranks import run_ranks


def _threads() -> dict[int, tuple[str, int, int]]:
    """Every thread of this process: its name, scheduling policy and nice, as the kernel
    reports them (the main thread's id is the process's, the smallest)."""
    out = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        with open(f"/proc/self/task/{tid}/comm") as f:
            name = f.read().strip()
        out[tid] = (name, os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid))
    return out


def _worker(rank: int, world: int, port: int, out) -> None:  # noqa: ANN001
    os.environ.pop(TRANSPORT_YIELD_ENV, None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    seen = {"before": _threads(), "unset": (transport_yield.apply(), _threads())}
    os.environ[TRANSPORT_YIELD_ENV] = "nice"
    seen["nice"] = (transport_yield.apply(), _threads())
    seen["idle"] = (transport_yield.apply("idle"), _threads())
    seen["idle again"] = (transport_yield.apply("idle"), _threads())
    seen["0"] = (transport_yield.apply("0"), _threads())
    os.environ.pop(TRANSPORT_YIELD_ENV)  # unset again: auto
    seen["auto, crowded"] = (transport_yield.apply(busy=True), _threads())
    dist.barrier()
    dist.destroy_process_group()
    out.put((rank, seen, os.geteuid()))


def _sched(threads: dict) -> dict[int, tuple[int, int]]:
    return {tid: (pol, nice) for tid, (_, pol, nice) in threads.items()}


@pytest.mark.multiprocess
def test_the_switch_sets_gloo_s_transport_threads_and_no_other() -> None:
    for _rank, seen, euid in run_ranks(_worker, 2):
        before = seen["before"]
        loops = {tid for tid, (name, _, _) in before.items() if name == THREAD_NAME}
        assert loops, "gloo started no transport thread"
        base = before[min(before)][2]  # the main thread's nice (the process's)
        normal = {tid: (os.SCHED_OTHER, base) for tid in before}
        assert _sched(before) == normal
        n, now = seen["unset"]  # the switch unset: nothing touched
        assert n == 0 and {t: v for t, v in _sched(now).items() if t in before} == normal
        for how in ("nice", "idle"):
            n, now = seen[how]
            assert n == len(loops)
            for tid, (pol, nice) in _sched(now).items():
                if tid not in loops:  # the process's other threads keep what they had
                    assert (pol, nice) == (os.SCHED_OTHER, base), (how, now[tid][0])
                elif how == "nice":
                    assert (pol, nice) == (os.SCHED_OTHER, 19)
                else:  # under SCHED_IDLE a thread's nice means nothing (it keeps its own)
                    assert pol == os.SCHED_IDLE
        assert seen["idle again"][0] == 0  # already so: nothing to change
        if euid == 0:  # back to the default needs CAP_SYS_NICE
            n, now = seen["0"]
            assert n == len(loops)
            assert {t: v for t, v in _sched(now).items() if t in before} == normal
        # unset is auto: idle where the workers crowd (after "0", which needs root to put
        # them back: otherwise they are still idle from before and nothing changes)
        n, now = seen["auto, crowded"]
        assert n == (len(loops) if euid == 0 else 0)
        assert {tid for tid, (pol, _) in _sched(now).items() if pol == os.SCHED_IDLE} == loops


def test_the_switch_refuses_other_values(monkeypatch) -> None:
    monkeypatch.delenv(TRANSPORT_YIELD_ENV, raising=False)
    assert transport_yield.mode() == "auto"
    for value in ("nice", "idle", "0", "auto"):
        monkeypatch.setenv(TRANSPORT_YIELD_ENV, value)
        assert transport_yield.mode() == value
    monkeypatch.setenv(TRANSPORT_YIELD_ENV, "1")
    with pytest.raises(ValueError, match=TRANSPORT_YIELD_ENV):
        transport_yield.mode()
    with pytest.raises(ValueError, match="not one of"):
        transport_yield.apply("19")


def test_a_refusal_stops_a_strict_caller_and_is_said_once_otherwise(monkeypatch, capsys) \
        -> None:  # noqa: ANN001
    """A thread that ended meanwhile is skipped; the kernel's refusal raises for the A/B
    script (``strict``: a side without its setting would measure nothing) and is said on
    stderr once, the threads left as they are, for a worker."""
    monkeypatch.setattr(transport_yield, "_state", {})
    monkeypatch.setattr(transport_yield, "_warned", [False])
    monkeypatch.setattr(transport_yield, "_threads", lambda: [1, 2, 3])
    refused: set[int] = set()

    def fake_set(tid: int, how: str) -> None:
        if tid == 1:
            raise ProcessLookupError(tid)
        if tid in refused:
            raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(transport_yield, "_set", fake_set)
    assert transport_yield.apply("nice") == 2  # thread 1 ended
    refused.update({2, 3})
    with pytest.raises(RuntimeError, match="refused"):
        transport_yield.apply("0", strict=True)
    assert transport_yield.apply("0") == 0
    assert transport_yield.apply("0") == 0
    assert capsys.readouterr().err.count("not applied") == 1
    assert transport_yield._state == {2: "nice", 3: "nice"}  # as they were left


def test_auto_counts_the_workers_threads_against_this_process_s_cpus() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert not transport_yield.crowded(cpus, 1)
    assert transport_yield.crowded(cpus + 1, 1)
    assert transport_yield.crowded(cpus, 2)
    assert not transport_yield.crowded(1, cpus)
    assert not transport_yield.crowded(cpus + 1, 1, on_cpu=False)  # GPU workers: never



def test_collectives_beside_compute_are_crowded_where_the_threads_fill_the_cpus() -> None:
    """DDP (its all-reduces on gloo's threads during the backward) yields from as many
    threads as CPUs; every other executor only beyond them."""
    from baselines.ddp import DDPExecutor
    from pipedream_impl.runtime.contract import Executor

    cpus = len(os.sched_getaffinity(0))
    assert transport_yield.crowded(cpus, 1, beside_compute=True)
    assert not transport_yield.crowded(cpus - 1, 1, beside_compute=True)
    assert not transport_yield.crowded(cpus, 1, on_cpu=False, beside_compute=True)
    assert DDPExecutor.collectives_beside_compute
    assert not Executor.collectives_beside_compute
