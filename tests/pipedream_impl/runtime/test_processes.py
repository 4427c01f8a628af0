"""pipedream_impl/runtime/processes.py: a worker forked from the fork server sees the
launcher's environment and working directory as they are when it starts, not as they were
when the server started (what a spawned worker saw, and what the runtime's switches need);
workers of one server share its hash seed, and a new server draws another."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipedream_impl.runtime import processes


def _report(out, name: str) -> None:  # noqa: ANN001 - a queue
    import sys

    # the worker's module brings the workloads; this test module does not
    out.put((os.environ.get(name), os.getcwd(), "workloads.registry" in sys.modules,
             hash("pipebench")))


def _started(ctx, name: str) -> tuple:  # noqa: ANN001
    out = ctx.Queue()
    p = processes.process(ctx, _report, (out, name))
    p.start()
    try:
        return out.get(timeout=120)
    finally:
        p.join(timeout=60)


@pytest.mark.multiprocess
def test_a_forked_worker_sees_the_environment_and_directory_of_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = processes.context()
    assert ctx.get_start_method() == "forkserver"
    _started(ctx, "PIPEBENCH_TEST_SWITCH")  # the fork server runs from here on
    monkeypatch.setenv("PIPEBENCH_TEST_SWITCH", "changed")
    monkeypatch.chdir(tmp_path)
    value, cwd, preloaded, _ = _started(ctx, "PIPEBENCH_TEST_SWITCH")
    assert value == "changed"
    assert Path(cwd) == tmp_path
    assert preloaded  # forked from the server's imports
    monkeypatch.delenv("PIPEBENCH_TEST_SWITCH")
    assert _started(ctx, "PIPEBENCH_TEST_SWITCH")[0] is None


@pytest.mark.multiprocess
def test_the_switch_spawns_workers_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(processes.FORKSERVER_ENV, "0")
    ctx = processes.context()
    assert ctx.get_start_method() == "spawn"
    assert _started(ctx, processes.FORKSERVER_ENV)[:3] == ("0", os.getcwd(), False)
    monkeypatch.setenv(processes.FORKSERVER_ENV, "yes")
    with pytest.raises(ValueError, match="PIPEBENCH_FORKSERVER='yes'"):
        processes.context()


@pytest.mark.multiprocess
def test_a_new_server_draws_a_new_hash_seed() -> None:
    """The string-hash seed stands for what a program draws when it is executed (its
    address-space layout too): two workers of one server share it, a new server's differ
    (two random 64-bit seeds alike: never)."""
    if "PYTHONHASHSEED" in os.environ:
        pytest.skip("PYTHONHASHSEED fixes the seed of every interpreter")
    ctx = processes.context()
    first, again = (_started(ctx, "X")[3] for _ in range(2))
    assert first == again
    processes.new_server()
    assert _started(ctx, "X")[3] != first
