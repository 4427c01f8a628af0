"""no_halt.py: the request is made only when asked, written as the kernel reads it, held,
made once, and a request that cannot be made is said, not assumed.

Why: ``PIPEBENCH_NO_HALT`` is measured by ``scripts/env_ab.py`` (issue 24); a side that
silently ran without the request would measure nothing. Where the test runs as root the
kernel's own answer is checked: reading ``/dev/cpu_dma_latency`` gives the machine's
current latency limit, which is 0 while a process holds the request (in a child process,
so that this test process leaves the machine as it found it).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from harness.experiments.runner import runtime_env
from pipedream_impl.runtime import no_halt
from pipedream_impl.runtime.no_halt import DMA_LATENCY, NO_HALT_ENV, hold

_REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No request held by this process, the switch unset."""
    monkeypatch.setattr(no_halt, "_held", [])
    monkeypatch.delenv(NO_HALT_ENV, raising=False)


def test_off_by_default_and_only_zero_or_one(fresh, tmp_path: Path,  # noqa: ANN001
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "latency"
    assert hold(target) is False and not target.exists()
    monkeypatch.setenv(NO_HALT_ENV, "0")
    assert hold(target) is False and not target.exists()
    monkeypatch.setenv(NO_HALT_ENV, "yes")
    with pytest.raises(ValueError, match="PIPEBENCH_NO_HALT='yes': use 1"):
        hold(target)


def test_the_request_is_a_32_bit_zero_held_open_and_made_once(  # noqa: ANN001
        fresh, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "latency"
    monkeypatch.setenv(NO_HALT_ENV, "1")
    assert hold(target) is True
    assert target.read_bytes() == struct.pack("i", 0) == b"\0\0\0\0"
    held = no_halt._held
    assert len(held) == 1 and not held[0].closed  # the request lasts while it is open
    target.write_bytes(b"")
    assert hold(target) is True and target.read_bytes() == b""  # not made again
    held[0].close()


def test_a_request_that_cannot_be_made_is_said(fresh, tmp_path: Path,  # noqa: ANN001
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv(NO_HALT_ENV, "1")
    assert hold(tmp_path) is False  # a directory: cannot be opened for writing
    err = capsys.readouterr().err
    assert f"{NO_HALT_ENV}=1: not applied: cannot write {tmp_path}" in err
    assert no_halt._held == []


def test_runs_record_the_switch_and_whether_it_applied(
        fresh, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    for name in ("PIPEBENCH_RECV_AHEAD", "PIPEBENCH_ALLREDUCE_BUCKET_MB", "PIPEBENCH_PIN",
                 "PIPEBENCH_TRANSPORT_YIELD"):
        monkeypatch.delenv(name, raising=False)
    assert runtime_env() == "defaults"
    monkeypatch.setenv(NO_HALT_ENV, "1")
    monkeypatch.setattr(no_halt, "DMA_LATENCY", tmp_path / "latency")  # writable: applies
    (tmp_path / "latency").write_bytes(b"")
    assert runtime_env() == "PIPEBENCH_NO_HALT=1"
    monkeypatch.setattr(no_halt, "DMA_LATENCY", tmp_path / "absent" / "latency")
    assert runtime_env() == "PIPEBENCH_NO_HALT=1 (not applied)"  # a run without root
    monkeypatch.setenv("PIPEBENCH_PIN", "1")
    assert runtime_env() == "PIPEBENCH_PIN=1,PIPEBENCH_NO_HALT=1 (not applied)"


_CHILD = """
import struct, sys
from pipedream_impl.runtime.no_halt import DMA_LATENCY, hold
assert hold()
print(struct.unpack("i", DMA_LATENCY.read_bytes()[:4])[0], flush=True)
"""


@pytest.mark.skipif(not os.access(DMA_LATENCY, os.W_OK),
                    reason="needs root: /dev/cpu_dma_latency is the kernel's, mode 0600")
def test_the_kernel_holds_a_zero_latency_limit_while_the_request_is_open() -> None:
    def limit() -> int:
        return struct.unpack("i", DMA_LATENCY.read_bytes()[:4])[0]

    before = limit()
    if before == 0:
        pytest.skip("another process holds a zero latency request: nothing to observe")
    env = {**os.environ, NO_HALT_ENV: "1", "PYTHONPATH": str(_REPO)}
    got = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert got.stdout.split() == ["0"]
    assert limit() == before  # released with the process


def test_the_runtime_switches_are_one_list() -> None:
    """runtime_env records every switch; the in-process A/B script flips only those an
    engine reads when it is made, from the same list (none read at a worker's start)."""
    from harness.experiments.runner import runtime_switches
    from pipedream_impl.runtime.comm import BACKWARD_LINK_ENV
    from pipedream_impl.runtime.pinning import PIN_ENV
    from pipedream_impl.runtime.processes import FORKSERVER_ENV
    from tests.scripts import load_script

    every, engine = runtime_switches()
    assert len(set(every)) == len(every) and set(engine) < set(every)
    assert BACKWARD_LINK_ENV in engine
    assert not {PIN_ENV, NO_HALT_ENV, FORKSERVER_ENV} & set(engine)
    assert load_script("same_process_ab").SWITCHES == engine
