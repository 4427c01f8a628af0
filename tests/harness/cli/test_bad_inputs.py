"""Bad input, every kind: one line ``error: ...`` on stderr, exit code 2, nothing written.

Most cases run the CLI in this process (``harness.cli.main`` with a patched argv: the
same code path as the installed script, without an interpreter start per case) or call
the reader or config that validates them; a handful go through the real ``pipebench``
entry point in a subprocess, including ``run`` with an MLflow store that must not appear.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import UserInputError
from harness.cli import main
from harness.config import RunConfig
from harness.experiments.layout import check_run
from harness.reporting.units import parse_bytes
from pipedream_impl.planner.cluster import parse_bandwidth, parse_cluster
from pipedream_impl.planner.plan import load_plan
from pipedream_impl.profiling.profile import load_profile

ROOT = Path(__file__).resolve().parents[3]
LINE = ("node{i} -- Layer{i} -- forward_compute_time={f}, backward_compute_time=2.0, "
        "activation_size={a}, parameter_size=1000000.0")
EDGES = "\tnode0 -- node1\n\tnode1 -- node2\n\tnode2 -- node3\n"
LAYER = ('{"id": "a", "forward_ms": 1, "backward_ms": 1, "activation_bytes": [1], '
         '"parameter_bytes": 1}')


def _graph(extra: str = "", bad: str = "1.0", act: str = "4096.0") -> str:
    """A 4-node chain in graph.txt form; node 2 (line 3) gets forward time ``bad`` and
    activation size ``act``."""
    lines = [LINE.format(i=i, f=bad, a=act) if i == 2 else LINE.format(i=i, f="1.0",
                                                                       a="4096.0")
             for i in range(4)]
    return "\n".join(lines) + "\n" + EDGES + extra


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    texts = {
        "good.txt": _graph(),
        "cycle.txt": _graph("\tnode3 -- node1\n"),
        "selfloop.txt": _graph("\tnode2 -- node2\n"),
        "notnumber.txt": _graph(bad="abc"),
        "nan.txt": _graph(bad="nan"),
        "negative.txt": _graph(bad="-5"),
        "negact.txt": _graph(act="[1.0; -1.0]"),
        "badedge.txt": _graph("\tnode3 -> node1\n"),
        "unknown.txt": _graph("\tnode3 -- node9\n"),
        "twice.txt": _graph().replace(EDGES, LINE.format(i=1, f="1.0", a="1.0") + "\n"
                                      + EDGES),
        "empty.txt": "",
        "notjson.json": "{not json",
        "list.json": "[1, 2]",
        "wrongkeys.json": '{"foo": 1}',
        "nobackward.json": '{"layers": [{"id": "a", "forward_ms": 1}]}',
        "strtime.json": '{"layers": [' + LAYER.replace('"forward_ms": 1', '"forward_ms": "x"')
                        + "]}",
        "jsoncycle.json": '{"layers": [' + LAYER + ", " + LAYER.replace('"a"', '"b"')
                          + '], "edges": [["a", "b"], ["b", "a"]]}',
        "plan_notjson.json": "nope",
        "plan_wrongkeys.json": '{"foo": 1}',
        "plan_noreplicas.json": '{"workers": 2, "predicted": {}, "stages": [{"layers": '
                                '[0, 2], "ranks": [0, 1], "predicted_time_s": 0}]}',
        "plan_zero.json": '{"workers": 1, "predicted": {}, "stages": [{"layers": [0, 2], '
                          '"replicas": 0, "ranks": [], "predicted_time_s": 0}]}',
        "plan_layers.json": '{"workers": 1, "predicted": {}, "stages": [{"layers": "ab", '
                            '"replicas": 1, "ranks": [0], "predicted_time_s": 0}]}',
    }
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)))
    return {name: tmp_path / name for name in [*texts, "binary.bin"]}


def _cli(argv: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) \
        -> str:
    """Run ``pipebench argv`` in-process; assert exit 2 and one ``error:`` line; return it."""
    monkeypatch.setattr(sys, "argv", ["pipebench", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# ---- numbers, names and units given as flags (in-process CLI) ---------------------------

FLAG_CASES = [
    (["plan", "--cluster", "0x4"], "--cluster '0x4' has no workers"),
    (["plan", "--cluster", "4x0"], "servers and workers per server must be at least 1"),
    (["plan", "--cluster", "100000x100000"], "too large"),
    (["plan", "--cluster", "2000"], "cannot plan 2000 workers in one level"),
    (["plan", "--cluster", "4", "--bandwidth", "0"], "positive finite number of bytes/s"),
    (["plan", "--cluster", "4", "--bandwidth", "1..2GB/s"], "cannot read --bandwidth"),
    (["plan", "--cluster", "4", "--bandwidth", "16GiB"], "is a size, not a bandwidth"),
    (["plan", "--cluster", "4", "--memory-limit", "16GB/s"], "is a bandwidth"),
    (["plan", "--cluster", "4", "--memory-limit", "0"], "--memory-limit must be a positive"),
    (["plan", "--cluster", "4", "--memory-limit", "1KB"], "no feasible plan"),
    (["plan", "--cluster", "4", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["plan", "--cluster", "5", "--straight"], "only 4 layers"),
    (["schedule", "--config", "2-1", "--minibatches", "0"], "--minibatches must be at least 1"),
    (["schedule", "--config", "1-1", "--minibatches", "100000000"], "units of work"),
    (["schedule", "--config", "1-1", "--in-flight", "0"], "--in-flight must be at least 1"),
    (["simulate", "--cluster", "4", "--minibatches", "-1"], "--minibatches must be at least"),
    (["simulate", "--cluster", "4", "--compute-factor", "nan"], "--compute-factor must be a "
                                                                "positive number (got nan)"),
    (["simulate", "--cluster", "4", "--compute-factor", "0"], "--compute-factor must be"),
    (["simulate", "--cluster", "4", "--latency", "inf"], "--latency must be 0 or a positive"),
    (["simulate", "--cluster", "4", "--system", "gpipe", "--microbatches", "0"],
     "--microbatches must be at least 1"),
    (["simulate", "--cluster", "4", "--system", "gpipe", "--stages", "100"],
     "--stages must be at most 4"),
    (["simulate", "--cluster", "4", "--system", "nope"], "unknown simulated system 'nope'"),
    (["reproduce", "table1"], "give --profiles DIR"),
    (["reproduce", "gpipe", "--minibatches", "0"], "--minibatches must be at least 1"),
    (["reproduce", "validation", "--workers", "a,b"], "--workers must be comma-separated"),
    (["reproduce", "validation", "--steps", "0"], "--steps must be at least 1"),
    (["reproduce", "validation", "--repeats", "0"], "--repeats must be at least 1"),
    (["profile", "-w", "vgg16", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["profile", "-w", "vgg16", "--steps", "-1"], "--steps must be at least 1"),
    (["profile", "-w", "vgg16", "--threads", "0"], "--threads must be at least 1"),
    (["profile", "-w", "vgg16", "--device", "tpu"], "--device must be auto, cpu or cuda"),
]


@pytest.mark.parametrize("argv, message", FLAG_CASES)
def test_bad_flag_values(argv: list[str], message: str, files: dict[str, Path],
                         tmp_path: Path, capsys: pytest.CaptureFixture,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.json"
    if argv[0] in ("plan", "simulate"):
        argv = [*argv, "--profile", str(files["good.txt"])]
    if argv[0] in ("plan", "profile"):
        argv = [*argv, "-o", str(out)]
    assert message in _cli(argv, capsys, monkeypatch)
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["run", "--bogus"], "No such option: --bogus"),
    (["nosuch"], "No such command 'nosuch'"),
    (["run", "--seed", "x"], "Invalid value for '--seed'"),
])
def test_usage_errors_are_clicks_message_and_exit_code_2(argv: list[str], message: str,
                                                          capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) \
        -> None:
    """Unknown options and commands, and values of the wrong type: click's usage message,
    not a traceback (typer raises the errors of its own copy of click)."""
    monkeypatch.setattr(sys, "argv", ["pipebench", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert message in err and "Traceback" not in err


def test_an_output_in_a_missing_folder_is_refused_before_any_work(
        files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    line = _cli(["plan", "--cluster", "4", "--profile", str(files["good.txt"]), "-o",
                 str(tmp_path / "no" / "plan.json")], capsys, monkeypatch)
    assert "the folder" in line and "does not exist" in line
    line = _cli(["simulate", "--cluster", "4", "--profile", str(files["good.txt"]),
                 "--gantt", str(tmp_path)], capsys, monkeypatch)
    assert "--gantt" in line and "is a folder" in line


# ---- profile files (the reader, then one through the CLI) -------------------------------

PROFILE_CASES = [
    ("missing.json", "does not exist"),
    ("binary.bin", "not a text file"),
    ("cycle.txt", "cycle: node1 -> node2 -> node3 -> node1"),
    ("selfloop.txt", "cycle: node2 -> node2"),
    ("notnumber.txt", "line 3: forward_compute_time='abc' is not a number"),
    ("nan.txt", "line 3: node node2: forward time nan must be a finite number"),
    ("negative.txt", "line 3: node node2: forward time -5.0"),
    ("negact.txt", "line 3: node node2: activation size -1.0"),
    ("badedge.txt", "line 8: expected"),
    ("unknown.txt", "line 8: edge node3 -- node9 names unknown node node9"),
    ("twice.txt", "line 5: node node1 is declared twice"),
    ("empty.txt", "no nodes in graph"),
    ("notjson.json", "not valid JSON (line 1, column 2"),
    ("list.json", "expected a JSON object"),
    ("wrongkeys.json", 'needs "layers"'),
    ("nobackward.json", 'layers[0] (a) has no "backward_ms"'),
    ("strtime.json", 'layers[0] (a): "forward_ms" must be a number'),
    ("jsoncycle.json", "cycle: a -> b -> a"),
    ("plan_wrongkeys.json", "needs \"layers\""),
]


@pytest.mark.parametrize("name, message", PROFILE_CASES)
def test_bad_profile_files_name_the_line_or_key(name: str, message: str,
                                                files: dict[str, Path]) -> None:
    path = files.get(name, files["good.txt"].parent / name)
    with pytest.raises(UserInputError) as e:
        load_profile(path)
    assert message in str(e.value) and str(path) in str(e.value)
    assert "\n" not in str(e.value)


def test_a_profile_with_a_cycle_through_the_cli(files: dict[str, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "plan.json"
    line = _cli(["plan", "--cluster", "4", "--profile", str(files["cycle.txt"]), "-o",
                 str(out)], capsys, monkeypatch)
    assert "remove the edge node3 -- node1" in line and not out.exists()


# ---- plan files -------------------------------------------------------------------------

PLAN_CASES = [
    ("missing.json", "does not exist; make one with `pipebench plan"),
    ("plan_notjson.json", "not valid JSON (line 1, column 1"),
    ("plan_wrongkeys.json", 'no "stages" key (found: foo)'),
    ("plan_noreplicas.json", 'stages[0] has no "replicas"'),
    ("plan_zero.json", 'stages[0]: "replicas" must be a whole number >= 1 (got 0)'),
    ("plan_layers.json", 'stages[0]: "layers" must be [start, stop]'),
    ("good.txt", "not valid JSON"),
    ("wrongkeys.json", 'no "stages" key'),
    ("nobackward.json", "this is a profile, not a plan"),
]


@pytest.mark.parametrize("name, message", PLAN_CASES)
def test_bad_plan_files_name_the_key(name: str, message: str, files: dict[str, Path]) -> None:
    path = files.get(name, files["good.txt"].parent / name)
    with pytest.raises(UserInputError, match="^plan ") as e:
        load_plan(str(path))
    assert message in str(e.value)


def test_a_plan_for_another_profile_is_refused(files: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tmp_path / "plan.json"
    monkeypatch.setattr(sys, "argv", ["pipebench", "plan", "--cluster", "2", "--profile",
                                      str(files["good.txt"]), "-o", str(plan)])
    main()
    capsys.readouterr()
    other = tmp_path / "other.txt"
    other.write_text(_graph().replace("node", "n"))
    line = _cli(["simulate", "--cluster", "2", "--profile", str(other), "--plan", str(plan)],
                capsys, monkeypatch)
    assert "names node 'node0', which the profile does not have" in line


# ---- units and clusters -----------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("16GB/s", "is a bandwidth"), ("10Gbps", "is a bandwidth"), ("lots", "cannot read"),
    ("0", "positive size"), ("-1GB", "cannot read"), ("nan", "cannot read"),
    ("1e999", "positive size"), ("16 PB", "cannot read"),
])
def test_memory_sizes_are_read_as_bytes(text: str, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        parse_bytes(text)


def test_sizes_and_bandwidths_use_their_own_units() -> None:
    assert parse_bytes("16GB") == 16e9 and parse_bytes("1KB") == 1e3
    assert parse_bytes("2GiB") == 2 * 2**30 and parse_bytes("1.5e9") == 1.5e9
    assert parse_bandwidth("10Gbps") == 1.25e9 and parse_bandwidth("15.75GB/s") == 15.75e9
    with pytest.raises(UserInputError, match="is a size, not a bandwidth"):
        parse_bandwidth("16GiB")
    with pytest.raises(UserInputError, match="level 0 has 0 workers|has no workers"):
        parse_cluster("0x4")


# ---- RunConfig: more cases in tests/harness/test_config.py --------------------------

def test_a_plan_for_another_workload_is_refused(files: dict[str, Path],
                                                capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    plan = files["good.txt"].parent / "plan.json"
    monkeypatch.setattr(sys, "argv", ["pipebench", "plan", "--cluster", "2", "--profile",
                                      str(files["good.txt"]), "--straight", "-o", str(plan)])
    main()
    capsys.readouterr()
    with pytest.raises(UserInputError, match="plan covers 4 layers, vgg16/tiny has 40"):
        check_run(RunConfig.from_flags(system="pipedream", workload="vgg16", workers=2,
                                       plan=str(plan)))
    with pytest.raises(UserInputError, match='no "stages" key'):
        check_run(RunConfig.from_flags(system="pipedream", workload="vgg16", workers=2,
                                       plan=str(files["wrongkeys.json"])))


# ---- through the installed entry point --------------------------------------------------

def _pipebench(argv: list[str], env: dict[str, str] | None = None) -> str:
    exe = Path(sys.executable).parent / "pipebench"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "harness.cli"]
    r = subprocess.run(cmd + argv, capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.mark.cli
def test_entry_point_plan_and_simulate_files(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert "not valid JSON" in _pipebench(["plan", "--cluster", "4", "--profile",
                                           str(files["notjson.json"]), "-o", str(out)])
    assert "has no \"replicas\"" in _pipebench(["simulate", "--profile",
                                                str(files["good.txt"]), "--plan",
                                                str(files["plan_noreplicas.json"])])
    assert not out.exists()


@pytest.mark.cli
@pytest.mark.parametrize("argv, message", [
    (["--lr", "nan"], "--lr must be a positive number (got nan)"),
    (["--system", "pipedream", "--workers", "1000"], "PIPEBENCH_MAX_WORKERS"),
])
def test_entry_point_run_fails_before_any_worker_or_store(argv: list[str], message: str,
                                                          tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    line = _pipebench(["run", "-w", "vgg16", "--epochs", "1", "--max-steps", "1", "--quiet",
                       *argv], env={"MLFLOW_TRACKING_URI": f"sqlite:///{db}"})
    assert message in line
    assert not db.exists()


@pytest.mark.cli
def test_entry_point_profile_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    line = _pipebench(["profile", "-w", "vgg16", "--batch-size", "0", "-o", str(out)])
    assert "--batch-size must be at least 1 (got 0)" in line and not out.exists()


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "--resume", "{tmp}", "--workload", "vgg16"], "drop --workload"),
    (["run", "--resume", "{tmp}", "--inject-fault", "kill:1:F3"], "drop --inject-fault"),
    (["run", "--resume", "{tmp}", "--stage-lr", "same"], "drop --stage-lr"),
    (["run", "--resume", "{tmp}/none"], "no such directory"),
    (["run", "--resume", "{tmp}"], "no checkpoint there"),
    (["run", "-w", "vgg16", "--system", "ddp", "--workers", "2", "--inject-fault",
      "kill:1:SF3"], "ddp has no action 'SF'"),
    (["run", "-w", "vgg16", "--system", "deepspeed-pipe", "--workers", "2",
      "--checkpoint-dir", "{tmp}"], "cannot checkpoint"),
])
def test_resilience_options_refuse_bad_input(argv: list[str], expected: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    line = _cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys, monkeypatch)
    assert expected in line
