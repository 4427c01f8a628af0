"""The nightly benchmark end to end against a real ``mlflow server`` on loopback: a small
suite's runs arrive (parent, cells, repeats with per-epoch metrics, system metrics, traces);
each trace is valid Chrome trace JSON whose busy time per worker is the run's
``busy_s_worker_<r>``; ``compare`` rebuilds the table from the store; ``regressions
--history`` finds planted earlier results there (or in a directory of result files) and
flags them; the dashboard opens in headless Chromium with no console error and every plot
visible."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harness.paths import REPO
from pipedream_impl.runtime.launcher import free_port

pytestmark = [pytest.mark.cli, pytest.mark.multiprocess]

PIPEBENCH = [sys.executable, "-m", "harness.cli"]
EXPERIMENT = "suite-test"
SUITE = """name = "test-tiny"
description = "three systems, two repeats"
repeats = 2
threads = 1
device = "cpu"

[[matrix]]
workloads = ["vgg16"]
systems = ["single", "pipedream", "ddp"]
workers = [2]
mode = "throughput"
epochs = 2
steps = 1
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real ``mlflow server`` (sqlite backend, served artifacts) on a free loopback port."""
    root = tmp_path_factory.mktemp("server")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server",
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{root / 'store.db'}",
                             "--artifacts-destination", str(root / "artifacts")],
                            stdout=subprocess.DEVNULL, stderr=open(root / "server.log", "w"))
    deadline = time.monotonic() + 120
    while True:  # poll its health endpoint until it answers
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()}")
        time.sleep(0.5)
    yield uri
    proc.terminate()
    proc.wait(timeout=30)


def _run(args: list[str], uri: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    return subprocess.run(PIPEBENCH + args, capture_output=True, text=True, env=env,
                          timeout=900, cwd=REPO)


@pytest.fixture(scope="module")
def suite_result(server: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("suite")
    (root / "tiny.toml").write_text(SUITE)
    out = root / "result.json"
    r = _run(["bench", "--suite", str(root / "tiny.toml"), "--json", str(out),
              "--experiment", EXPERIMENT, "--quiet"], server)
    assert r.returncode == 0, r.stdout + r.stderr
    # --quiet: the report (no -o) and nothing else: no pointer lines, no mlflow progress
    assert "MLflow parent run" not in r.stdout and f"wrote {out}" not in r.stdout, r.stdout
    assert "Downloading artifacts" not in r.stderr, r.stderr
    return json.loads(out.read_text())


def _client(uri: str):  # noqa: ANN202
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _runs(uri: str) -> list:
    client = _client(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    return client.search_runs([exp.experiment_id], max_results=1000)


def test_the_server_received_every_run_of_the_suite(server: str, suite_result: dict) -> None:
    runs = _runs(server)
    parent = [r for r in runs if r.data.tags.get("pipebench.kind") == "suite"]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    pid = parent[0].info.run_id
    assert parent[0].data.tags["pipebench.suite"] == "test-tiny"
    assert parent[0].data.tags["pipebench.machine"] == suite_result["environment"]["machine"]
    from harness.reporting.results import DEFINITIONS  # the figures' definitions it ran
    assert suite_result["definitions"] == DEFINITIONS
    cells = [r for r in runs if r.data.tags.get("pipebench.kind") == "cell"]
    assert {r.data.tags["mlflow.parentRunId"] for r in cells} == {pid}
    assert sorted(r.data.tags["pipebench.cell"] for r in cells) == sorted(
        c["key"] for c in suite_result["cells"])
    cell_ids = {r.info.run_id for r in cells}
    training = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in cell_ids]
    assert len(training) == 3 * 2  # every cell, every repeat
    client = _client(server)
    for r in training:
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "samples_per_s")]
        assert sorted(steps) == [0, 1]
    assert any(k.startswith("system/") for r in training for k in r.data.metrics)
    stored = json.loads(Path(client.download_artifacts(pid, "suite.json")).read_text())
    assert stored["cells"] == suite_result["cells"]
    # a cell run's median is its repeats' median
    for c in cells:
        mine = next(x for x in suite_result["cells"] if x["key"] == c.data.tags["pipebench.cell"])
        assert c.data.metrics["throughput_samples_per_s"] == pytest.approx(
            mine["metrics"]["throughput_samples_per_s"]["median"])


def test_cells_keep_what_each_action_cost_from_their_runs_metrics(
        server: str, suite_result: dict) -> None:
    """A cell's ``actions`` against its runs as the server stored them: each figure the
    median over the repeats of the run's own metric per minibatch (the cell's minibatches
    per epoch times the run's epochs); one thread's CPU time within its actions' wall
    time; the single trainer, which times no actions of its own, keeps none."""
    cells = {c["system"]: c for c in suite_result["cells"]}
    assert cells["single"]["actions"] == {}
    for system, kinds in (("pipedream", {"F", "B", "U", "SF"}), ("ddp", {"F", "B", "A", "U"})):
        kept = cells[system]["actions"]
        assert set(kept) == {"0", "1"} and kinds <= set(kept["0"])
        _check_actions(server, cells[system])


def _check_actions(server: str, cell: dict) -> None:
    runs = [_client(server).get_run(r).data.metrics for r in cell["run_ids"]]
    per_epoch = cell["counters"]["steps_per_epoch"]
    for w, kinds in cell["actions"].items():
        for kind, figures in kinds.items():
            wall = [1e3 * r[f"action_s_{kind}_worker_{w}"] / (per_epoch * r["epochs_run"])
                    for r in runs]
            cpu = [1e3 * r[f"action_cpu_s_{kind}_worker_{w}"] / (per_epoch * r["epochs_run"])
                   for r in runs]
            assert figures["wall ms"] == pytest.approx(sum(wall) / 2)  # 2 repeats' median
            assert figures["CPU ms"] == pytest.approx(sum(cpu) / 2)
            assert 0 <= figures["CPU ms"] <= figures["wall ms"] * 1.001


def test_each_trace_is_chrome_json_with_the_runs_busy_time_per_worker(
        server: str, suite_result: dict) -> None:
    """Both the trace and busy_s come from the workers' booked spans, so this checks the
    way there: every span shipped, converted to microseconds, placed on its worker's track
    and uploaded, none lost or double counted."""
    client = _client(server)
    checked = 0
    for r in _runs(server):
        if r.data.params.get("system") not in ("pipedream", "ddp"):  # cells: tags only
            continue
        trace = json.loads(Path(client.download_artifacts(r.info.run_id, "trace.json"))
                           .read_text())
        events = trace["traceEvents"]
        complete = [e for e in events if e["ph"] == "X"]
        assert all(isinstance(e[k], (int, float)) for e in complete for k in ("ts", "dur"))
        assert all(e["dur"] >= 0 and e["pid"] == 0 for e in complete)
        tracks = {e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        assert tracks == {0, 1} == {e["tid"] for e in complete}
        for rank in tracks:
            busy_us = sum(e["dur"] for e in complete if e["tid"] == rank and e["cat"] == "busy")
            assert busy_us / 1e6 == pytest.approx(r.data.metrics[f"busy_s_worker_{rank}"],
                                                  rel=1e-6)
        kinds = {e["args"]["kind"] for e in complete}
        if r.data.params["system"] == "pipedream":
            assert {"F", "B", "SF", "RF", "SB", "RB", "U"} <= kinds
        checked += 1
    assert checked == 4  # two systems x two repeats


def test_compare_rebuilds_the_table_from_the_store(server: str, suite_result: dict) -> None:
    r = _run(["compare", "--experiment", EXPERIMENT, "--format", "json"], server)
    assert r.returncode == 0, r.stderr
    records = {x["run_id"]: x for x in json.loads(r.stdout)}
    expected = {run_id: (c["system"], value) for c in suite_result["cells"]
                for run_id, value in zip(c["run_ids"],
                                         c["metrics"]["throughput_samples_per_s"]["values"],
                                         strict=True)}
    assert set(records) == set(expected)
    for run_id, (system, value) in expected.items():
        assert records[run_id]["system"] == system
        assert records[run_id]["throughput_samples_per_s"] == pytest.approx(value)
    md = _run(["compare", "--experiment", EXPERIMENT, "--filter",
               "params.system = 'ddp'"], server)
    assert md.returncode == 0 and md.stdout.count("| ddp |") == 2
    bad = _run(["compare", "--experiment", EXPERIMENT, "--filter", "params.x ==="], server)
    assert bad.returncode == 2 and "error:" in bad.stderr


def _planted_nights(suite_result: dict) -> list[tuple[str, dict]]:
    """Four nights of ``suite_result``: two with pipedream 10x faster, then two (the last
    one judged as tonight) at the measured speed."""
    nights = []
    for day, factor in (("01", 10), ("02", 10), ("03", 1), ("04", 1)):
        night = copy.deepcopy(suite_result)
        night["created"] = f"2000-01-{day}T00:00:00+00:00"
        for c in night["cells"]:
            if c["system"] != "pipedream":
                continue
            for name in ("throughput_samples_per_s", "throughput_per_reference",
                         "steady_samples_per_s", "steady_per_reference"):
                # raw 1% apart, drift-cancelled 5%: the raw twin is the stabler in these
                # nights, so it is the one judged (equal spreads made the choice a
                # rounding coin flip, and the other twin carries the reference's noise)
                step = 5 if name.endswith("per_reference") else 1
                stat = c["metrics"][name]
                stat["values"] = [factor * max(stat["values"]) * (1 + step * k / 100)
                                  for k in range(len(stat["values"]))]
        nights.append((day, night))
    return nights


def test_regressions_against_the_history_in_the_store(server: str, suite_result: dict,
                                                      tmp_path: Path) -> None:
    """The planted nights (``_planted_nights``) as results of the same suite on the same
    machine in the store. Tonight and last night both break the rule against the two
    nights before them: a regression over nights (one broken night alone would be
    suspicious).

    Every night's pipedream figures are planted, tonight's too, so the verdict does not hang
    on how noisy this machine was while the suite ran: a CI run here once measured its two
    pipedream repeats 3.6x apart, which no 10x drop over two repeats can clear."""
    client = _client(server)
    exp = client.get_experiment_by_name(EXPERIMENT)
    for day, night in _planted_nights(suite_result):
        run = client.create_run(exp.experiment_id, run_name="suite-test-tiny", tags={
            "pipebench.kind": "suite", "pipebench.suite": "test-tiny",
            "pipebench.machine": suite_result["environment"]["machine"]})
        # tonight is its own run, as a suite run logs it; the earlier nights name none
        night["mlflow"] = {"parent_run_id": run.info.run_id, "experiment": EXPERIMENT} \
            if day == "04" else None
        client.log_dict(run.info.run_id, night, "suite.json")
        client.set_terminated(run.info.run_id, "FINISHED")
        current = run.info.run_id
    r = _run(["regressions", "--current", current, "--history", "2", "--all"], server)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "| regression | vgg16/tiny/w2/pipedream/throughput" in r.stdout, r.stdout
    same = tmp_path / "same.json"
    same.write_text(json.dumps(suite_result))
    r = _run(["regressions", "--current", str(same), "--baseline", str(same)], server)
    assert r.returncode == 0 and "no regression" in r.stdout


def test_regressions_against_a_directory_of_results(suite_result: dict,
                                                    tmp_path: Path) -> None:
    """The same nights as files in a directory (tonight's among them), with no store: the
    same verdict. Results of another suite or machine there, however slow or fast, are
    passed over; so is a night after tonight."""
    history = tmp_path / "nights"
    history.mkdir()
    nights = _planted_nights(suite_result)
    for day, night in nights:
        (history / f"night-{day}.json").write_text(json.dumps(night))
    decoys = {"other-suite": ("suite", "name", "another"),
              "other-machine": ("environment", "machine", "elsewhere"),
              "later": (None, "created", "2000-01-05T00:00:00+00:00")}
    for name, (part, key, value) in decoys.items():
        decoy = copy.deepcopy(nights[-1][1])  # at tonight's speed: no regression on its own
        (decoy[part] if part else decoy)[key] = value
        if name != "later":
            decoy["created"] = "2000-01-03T12:00:00+00:00"  # newer than the slow nights
        (history / f"{name}.json").write_text(json.dumps(decoy))
    uri = f"sqlite:///{tmp_path / 'empty.db'}"
    tonight, report = history / "night-04.json", tmp_path / "report.md"
    args = ["regressions", "--current", str(tonight), "--history", "2", "--all", "-o",
            str(report)]  # a file: the console would wrap long lines
    r = _run([*args, "--history-dir", str(history)], uri)
    assert r.returncode == 1, r.stdout + r.stderr
    text = report.read_text()
    assert "| regression | vgg16/tiny/w2/pipedream/throughput" in text, text
    assert "false-alarm rate of 0.05 per comparison" in text, text  # the rule's rate
    assert f"the last 2 test-tiny result(s) of this machine in {history}" in text, text
    sha = suite_result["environment"]["git_sha"]  # the commits and times compared
    assert (f"Current: {sha} (2000-01-04T00:00:00+00:00). Against: {sha} "
            "(2000-01-01T00:00:00+00:00), ") in text, text
    r = _run(args, uri)  # the empty store: nothing to compare
    assert r.returncode == 0 and "nothing to compare" in report.read_text(), r.stderr
    # the dashboard from the directory: the newest result of the suite (the later night)
    # and the four nights before it; the other suite's and machine's are left out
    page = tmp_path / "page.html"
    r = _run(["dashboard", "--suite", "test-tiny", "--history-dir", str(history), "-o",
              str(page)], uri)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"\(5\s+suite\s+result\(s\)\)", r.stdout), r.stdout


def test_bench_render_reports_a_stored_result_and_runs_nothing(server: str, suite_result: dict,
                                                              tmp_path: Path) -> None:
    """``bench --render`` writes the report of a result already run: the command that ran
    it and the one that made the report again, every system's row and the level its MDC
    column is stated at, the same rows printed to a pipe, and no run reaches the store."""
    stored = tmp_path / "result.json"
    stored.write_text(json.dumps(suite_result))
    before = len(_runs(server))
    report = tmp_path / "report.md"
    r = _run(["bench", "--render", str(stored), "-o", str(report), "--quiet"], server)
    assert r.returncode == 0, r.stdout + r.stderr
    text = report.read_text()
    assert "Generated by `pipebench bench --suite " in text, text  # the run's command
    assert f"made again from its result by `pipebench bench --render {stored}" in text, text
    for system in ("single", "pipedream", "ddp"):
        assert f"| {system} | ok" in text, text
    assert "judged metrics it tests at 0.05 /" in text, text
    # printed to a pipe (not a terminal: a Console 80 columns wide), rows stay whole
    piped = _run(["bench", "--render", str(stored)], server)
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert max(map(len, rows)) > 80
    assert [line for line in piped.stdout.splitlines() if line.startswith("|")] == rows
    assert len(_runs(server)) == before


def _hover_and_filter(page) -> dict:  # noqa: ANN001 - a Playwright page
    """Hover the first point of the first history plot as a mouse would, read the label
    Plotly draws; then pick one system in the filter and list what stays on screen."""
    point = page.locator(".fig .plot .scatterlayer .trace .points path").first
    point.scroll_into_view_if_needed()
    box = point.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector(".hoverlayer .hovertext", timeout=5000)
    hover = page.locator(".hoverlayer .hovertext").first.text_content()
    page.select_option("#f-system", "ddp")
    shown = page.evaluate("""Array.from(document.querySelectorAll('div.fig'))
        .filter(e => e.offsetParent !== null).map(e => e.dataset.systems)""")
    return {"hover": hover, "shown": shown}


@pytest.mark.browser
def test_the_dashboard_opens_in_a_real_browser(server: str, suite_result: dict,
                                               tmp_path: Path) -> None:
    from tests.browser import check_page

    page = tmp_path / "report.html"
    r = _run(["dashboard", "-o", str(page), "--experiment", EXPERIMENT], server)
    assert r.returncode == 0, r.stdout + r.stderr
    report = check_page(page, "div.plot", then=_hover_and_filter)
    assert report.problems() == []
    # a history per cell (3), throughput, bytes, memory, bubble, timelines (pipedream, ddp)
    assert report.total == report.visible >= 9
    # the newest result by when it was measured, not the planted older one started later
    assert "test-tiny" in report.title and suite_result["created"] in report.title
    hover = report.then["hover"]
    assert "vgg16/tiny/w2/" in hover and re.search(r"geometric mean \d", hover), hover
    shown = report.then["shown"]  # only ddp's figures, and those of every system
    assert shown and all(s == "" or "ddp" in s.split(",") for s in shown), shown
    assert any(s == "ddp" for s in shown)
    # the suite run logged its own page to MLflow
    logged = Path(_client(server).download_artifacts(suite_result["mlflow"]["parent_run_id"],
                                                     "dashboard.html")).read_text()
    assert "Plotly.newPlot" in logged and suite_result["created"] in logged


@pytest.mark.parametrize("args, message", [
    (["bench", "--suite", "no-such-suite"], "no suite 'no-such-suite'"),
    (["bench", "--repeats", "0"], "--repeats must be at least 1"),
    (["bench", "--systems", "single,warp"], "unknown system 'warp'"),
    (["bench", "--plant", "pipedream"], "expected SYSTEM=FAULT"),
    (["bench", "--plant", "pipedream=slow:1:F:0.5"], "FACTOR must be a number >= 1"),
    (["bench", "--plant", "ddp=slow:*:*:1.1", "--plant", "ddp=slow:*:*:1.2"],
     "ddp is planted twice"),
    (["bench", "--render", "x.json", "--suite", "smoke"], "give no --suite, --json, --plant"),
    (["bench", "--render", "/no/such.json"], "no suite result at /no/such.json"),
    (["regressions", "--current", "x.json", "--baseline", "x.json", "--alpha", "0.7"],
     "--alpha must be in (0, 0.5)"),
    (["regressions", "--current", "x.json"], "give --baseline FILE|RUN or --history N"),
    (["regressions", "--current", "x.json", "--baseline", "x.json", "--history-dir", "d"],
     "--history-dir needs --history N"),
    (["regressions", "--current", "README.md", "--history", "2", "--history-dir",
      "/no/such/dir"], "--history-dir /no/such/dir: no such directory"),
    (["regressions", "--current", "x.json", "--history", "2", "--history-dir", ".",
      "--experiment", "e"], "--experiment names the store's history"),
    (["dashboard", "--json", "x.json", "--history-dir", "."], "not both"),
    (["dashboard", "--history-dir", "/no/such/dir"], "--history-dir /no/such/dir: no such"),
    (["regressions", "--current", "/no/such.json", "--baseline", "/no/such.json"],
     "no suite result at /no/such.json"),
    (["compare", "--format", "xml"], "--format must be md, csv or json"),
    (["dashboard", "--json", "/no/such.json"], "no suite result at /no/such.json"),
])
def test_bad_input_is_one_line_and_exit_code_2(args: list[str], message: str,
                                               tmp_path: Path) -> None:
    r = _run(args, f"sqlite:///{tmp_path / 'unused.db'}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
