"""scripts/transport_spins.py's counting, on calls written by hand: event returns, timeouts
and reads of the transport threads, spins (5 or more event returns in a row without a
read) with their lengths, which of them followed a main-thread write, and ``perf
script``'s lines as this machine's perf prints them."""

from __future__ import annotations

import pytest

from tests.scripts import load_script

ts = load_script("transport_spins")
LOOP = "gloo_tcp_loop"
EV, READ, WRITE = "syscalls:sys_exit_epoll_wait", "syscalls:sys_enter_recvfrom", \
    "syscalls:sys_enter_writev"


def test_spins_are_counted_and_timed_and_tied_to_the_main_thread_s_writes() -> None:
    calls = [("python", 10, 10, 0.0, WRITE, "0x3")]
    calls += [(LOOP, 10, 11, 1e-4 + i * 1e-6, EV, "0x1") for i in range(7)]  # 6 us
    calls += [(LOOP, 10, 11, 2e-3, READ, "0x0"),
              (LOOP, 10, 11, 3e-3, EV, "0x1"), (LOOP, 10, 11, 3.1e-3, READ, "0x0"),
              (LOOP, 10, 11, 1e-2, EV, "0x0")]  # a read per wake-up, then the tick
    calls += [(LOOP, 10, 11, 0.5 + i * 1e-6, EV, "0x1") for i in range(5)]  # 4 us, no write
    calls += [(LOOP, 10, 11, 0.6 + i * 1e-6, EV, "0x1") for i in range(4)]  # too short
    calls[-4:-4] = [(LOOP, 10, 11, 0.55, EV, "0x0")]  # the tick ends the 5-run
    calls += [("python", 20, 20, 0.7, WRITE, "0x1"), ("other", 20, 21, 0.7, EV, "0x1")]
    got = ts.spins(sorted(calls, key=lambda c: c[3]))
    assert got["processes"] == 1  # process 20 has no transport thread
    assert got["epoll events"] == 7 + 1 + 5 + 4
    assert got["epoll timeouts"] == 2
    assert got["socket reads"] == 2
    assert got["events per read"] == pytest.approx(17 / 2)
    assert got["spins"] == 2
    assert got["spin s"] == pytest.approx(6e-6 + 4e-6)
    assert got["median spin ms"] == pytest.approx(1e3 * 5e-6)
    assert got["spins after a main-thread write"] == 1


def test_the_thread_s_own_writes_end_a_run_and_interrupted_waits_are_not_events() -> None:
    calls = [(LOOP, 1, 2, i * 1e-6, EV, "0x1") for i in range(4)]
    calls += [(LOOP, 1, 2, 5e-6, EV, "0xfffffffffffffffc")]  # -EINTR
    calls += [(LOOP, 1, 2, 6e-6, WRITE, "0x2")]  # EPOLLOUT: it writes a queued send
    calls += [(LOOP, 1, 2, 1e-5 + i * 1e-6, EV, "0x1") for i in range(4)]
    got = ts.spins(calls)
    assert (got["epoll events"], got["epoll timeouts"], got["spins"]) == (8, 0, 0)


def test_perf_script_lines_are_read(tmp_path, monkeypatch) -> None:
    text = ("   gloo_tcp_loop 13141/13149 65588.430857:     syscalls:sys_exit_epoll_wait: 0x1\n"
            "          python 13141/13141 65588.437837:     syscalls:sys_enter_writev: "
            "fd: 0x0000000d, vec: 0x7ffd, vlen: 0x00000002\n"
            "   gloo_tcp_loop 13141/13149 65588.5:     syscalls:sys_exit_epoll_wait: 0x0\n")

    class Done:
        stdout = text

    monkeypatch.setattr(ts.subprocess, "run", lambda *a, **k: Done())
    got = ts._events(tmp_path / "x.data")
    assert got == [(LOOP, 13141, 13149, 65588.430857, EV, "0x1"),
                   ("python", 13141, 13141, 65588.437837, WRITE, "0x00000002"),
                   (LOOP, 13141, 13149, 65588.5, EV, "0x0")]


def test_the_report_has_a_row_per_setting_in_the_columns_order() -> None:
    figures = ts.spins([(LOOP, 1, 2, 0.0, EV, "0x1"), (LOOP, 1, 2, 1e-3, READ, "0x0")])
    text = ts.render({"PIPEBENCH_RECV_AHEAD=0": figures}, "cmd")
    assert "| " + " | ".join(ts.COLUMNS) + " |" in text
    assert "| PIPEBENCH_RECV_AHEAD=0 | 1 | 1 | 0 | 1 | 1.0 | 0 | 0.000 | 0.00 | 0 |" in text
