"""``--allreduce ring|ps|ps-colocated|byteps --cpu-machines k`` on ``simulate`` and ``plan``,
and ``reproduce byteps``'s checks: bad values give one ``error:`` line and exit 2; good
ones reach the output (run in this process, as tests/harness/cli/test_bad_inputs.py does)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.cli import main

LINE = ("node{i} -- Layer{i} -- forward_compute_time=10.0, backward_compute_time=20.0, "
        "activation_size=4096.0, parameter_size=100000000.0")
GRAPH = "\n".join(LINE.format(i=i) for i in range(4)) + "\n" \
    + "".join(f"\tnode{i} -- node{i + 1}\n" for i in range(3))


@pytest.fixture()
def profile(tmp_path: Path) -> str:
    path = tmp_path / "graph.txt"
    path.write_text(GRAPH)
    return str(path)


def _cli(argv: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
         code: int = 2) -> str:
    monkeypatch.setattr(sys, "argv", ["pipebench", *argv])
    try:
        main()
        got = 0
    except SystemExit as e:  # typer exits 0 on success in some versions
        got = e.code or 0
    out = capsys.readouterr()
    assert got == code, out.err
    assert "Traceback" not in out.err
    if code:
        lines = out.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), out.err
        return lines[0]
    return out.out


BAD = [
    (["simulate", "--allreduce", "bogus"], "--allreduce must be one of ring, ps, "
                                           "ps-colocated, byteps (got 'bogus')"),
    (["simulate", "--allreduce", "byteps", "--cpu-machines", "-1"],
     "--cpu-machines must be a whole number >= 0 (got -1)"),
    (["simulate", "--allreduce", "ps"], "--allreduce ps needs its server machines"),
    (["simulate", "--cpu-machines", "2"], "--allreduce ring uses no CPU machines"),
    (["plan", "--allreduce", "bogus"], "--allreduce must be one of"),
    (["plan", "--allreduce", "ps", "--cpu-machines", "0"], "needs its server machines"),
    (["plan", "--allreduce", "byteps", "--cpu-machines", "2", "--cost-model",
      "pipedream-2019"], "needs --cost-model pipebench"),
]


@pytest.mark.parametrize("argv, message", BAD)
def test_bad_sync_flags_are_one_line(argv: list[str], message: str, profile: str,
                                     capsys: pytest.CaptureFixture,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [*argv, "--profile", profile, "--cluster", "A:4x4"]
    assert message in _cli(argv, capsys, monkeypatch)


def test_reproduce_byteps_checks_its_inputs(tmp_path: Path, capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert "give --profiles DIR" in _cli(["reproduce", "byteps"], capsys, monkeypatch)
    assert "choose table1, other-tasks, gpipe, byteps, today, schedules or validation" in _cli(
        ["reproduce", "nope"], capsys, monkeypatch)
    assert "--json" in _cli(["reproduce", "byteps", "--profiles", str(tmp_path), "--json",
                             str(tmp_path / "no" / "x.json")], capsys, monkeypatch)


def test_good_sync_flags_reach_the_output(profile: str, capsys: pytest.CaptureFixture,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = _cli(["plan", "--profile", profile, "--cluster", "A:4x4", "--allreduce", "byteps",
                "--cpu-machines", "4"], capsys, monkeypatch, code=0)
    assert "byteps among machines (k = 4 CPU machines)" in " ".join(out.split())
    # dp of 400 MB, 120 ms of compute on 4 machines of 4 GPUs: 1.5 x 400 MB / 15.75 GB/s
    # inside, 400 MB / 1.25 GB/s among the machines with k = n = 4
    out = _cli(["simulate", "--profile", profile, "--cluster", "A:4x4", "--system", "dp",
                "--no-dp-overlap", "--allreduce", "ps", "--cpu-machines", "4"], capsys,
               monkeypatch, code=0)
    want = (0.120 + 1.5 * 4e8 / 15.75e9 + 4e8 / 1.25e9) / 16
    assert f"time per minibatch {want * 1e3:.2f} ms" in " ".join(out.split())
