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
             hash("pipebench"), "torchvision" in sys.modules))


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
    value, cwd, preloaded = _started(ctx, "PIPEBENCH_TEST_SWITCH")[:3]
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


_EARLY = """
import os, sys
from multiprocessing import forkserver
from pathlib import Path
from pipedream_impl.runtime import processes
processes.PRELOAD = ("tests.pipedream_impl.runtime.preload_probe",)
processes.start_server("gnmt8")
Path(sys.argv[1]).write_text(str(forkserver._forkserver._forkserver_pid))
if sys.argv[2] == "ready":
    processes.ready()
    print(Path(os.environ["PIPEBENCH_PROBE_DONE"]).exists())
"""


def _early(tmp_path: Path, then: str, **env: str) -> tuple[str, int]:
    """A process that starts its fork server early (preloading the probe), then waits for
    it (``ready``) or exits: its output, and the server's pid."""
    pid_file = tmp_path / "server.pid"
    try:
        out = _python(_EARLY, str(pid_file), then, PIPEBENCH_PROBE_DONE=str(tmp_path / "done"),
                      **env)
    finally:  # a server the code under test left behind must not outlive the test
        pid = int(pid_file.read_text()) if pid_file.exists() else 0
        if pid and _alive(pid):
            os.kill(pid, 9)
    return out, pid


def _python(script: str, *args: str, **env: str) -> str:
    """What ``python -c script args`` prints, run from the repository with ``env`` added;
    it must exit with 0."""
    import subprocess
    import sys

    from harness.paths import REPO

    r = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO,
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.multiprocess
def test_ready_returns_once_an_early_server_has_done_its_imports(tmp_path: Path) -> None:
    out, pid = _early(tmp_path, "ready")
    assert pid and out.strip() == "True"  # the server's preload ended before ready returned


@pytest.mark.multiprocess
def test_an_early_server_never_used_is_killed_at_exit(tmp_path: Path) -> None:
    """Its preload never ends and it holds the process's output open: without the kill at
    exit, the process's output would not close and the run above would time out."""
    _, pid = _early(tmp_path, "exit", PIPEBENCH_PROBE_BLOCK="1")
    assert pid and not _alive(pid)


_LOADED = """
import sys
from pipedream_impl.runtime import processes
from tests.pipedream_impl.runtime.test_processes import _started
processes.start_server(sys.argv[1])
print(_started(processes.context(), "X")[4])
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize(("workload", "torchvision"), [("gnmt8", False), ("VGG-16", True)])
def test_an_early_server_imports_its_workload_s_model_modules_only(
        workload: str, torchvision: bool) -> None:
    """A worker forked from a server started for a GNMT run finds no torchvision imported
    (nothing of GNMT's needs it), one for VGG-16 (an alias) finds it imported."""
    assert _python(_LOADED, workload).strip() == str(torchvision)


@pytest.mark.multiprocess
def test_a_server_started_for_a_worker_imports_every_workload_s() -> None:
    """A server started when a worker needs one (a suite's, whose rounds mix workloads)
    has every workload's model modules imported."""
    assert _started(processes.context(), "X")[4] is True
