"""scripts/env_ab.py: the order of its runs and their pairing by round, its tests' p-values
against brute force, its thread figures from /proc, and what it does with failed runs and
missing cells.

Why: results/recv-ahead-ab-*.md decide whether a runtime default changes (issue 24). The
p-value is checked against an exhaustive enumeration of every way the runs could have been
split between the sides (the exact permutation distribution of the rank-sum), the paired
one against every way of flipping the rounds' signs, not against scipy's own routines;
the runs' order is checked on a fake bench that records its calls;
the thread reader on a real child process.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

ab = load_script("env_ab")


def _brute_force_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact p of the rank-sum: the share of all splits of the pooled runs into
    groups of len(a) and len(b) whose A rank-sum lies at least as far from its mean."""
    pooled = sorted(a + b)
    rank = {v: i + 1 for i, v in enumerate(pooled)}  # no ties in these samples
    mean = len(a) * (len(pooled) + 1) / 2
    seen = abs(sum(rank[v] for v in a) - mean)
    splits = list(itertools.combinations(range(1, len(pooled) + 1), len(a)))
    return sum(abs(sum(s) - mean) >= seen - 1e-9 for s in splits) / len(splits)


@pytest.mark.parametrize(("a", "b"), [
    ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]),
    ([10.0, 12.0, 15.0, 11.0], [13.0, 16.0, 14.0, 18.0, 17.0]),
    ([5.0, 1.0, 9.0, 3.0, 7.0], [2.0, 8.0, 4.0, 6.0, 10.0]),
])
def test_p_value_equals_the_exhaustive_permutation_test(a, b) -> None:  # noqa: ANN001
    row = ab._row("cell", a, b, 1).split("|")
    assert float(row[5]) == pytest.approx(_brute_force_p(a, b), abs=5e-4)
    assert float(row[4]) == pytest.approx(statistics.median(b) / statistics.median(a),
                                          abs=0.005)


def _brute_force_signed_rank_p(logs: list[float]) -> float:
    """Two-sided exact p of the signed-rank statistic: the share of all 2^n ways of giving
    the ranks of |log| signs whose positive rank-sum lies at least as far from its mean."""
    ranks = {v: i + 1 for i, v in enumerate(sorted(abs(x) for x in logs))}  # no ties here
    n = len(logs)
    mean = n * (n + 1) / 4
    seen = abs(sum(ranks[abs(x)] for x in logs if x > 0) - mean)
    signs = list(itertools.product((0, 1), repeat=n))
    return sum(abs(sum(r * s for r, s in zip(range(1, n + 1), sg, strict=True)) - mean)
               >= seen - 1e-9 for sg in signs) / len(signs)


@pytest.mark.parametrize("ratios", [
    [1.10, 1.05, 1.08, 0.98, 1.12, 1.03],
    [0.90, 1.01, 0.95, 0.97, 0.93, 1.04, 0.96],
    [1.2, 0.8, 1.1, 0.9, 1.05],
])
def test_paired_p_equals_the_exhaustive_sign_flip_test(ratios) -> None:  # noqa: ANN001
    pairs = [(100.0, 100.0 * r) for r in ratios]
    row = ab._paired_row("cell", ab.METRIC, pairs).split("|")
    logs = [math.log(r) for r in ratios]
    p, n = row[5].split()
    assert float(p) == pytest.approx(_brute_force_signed_rank_p(logs), abs=5e-4)
    assert n == f"({len(ratios)})"
    assert float(row[3]) == pytest.approx(statistics.median(ratios), abs=5e-4)


def test_a_round_with_no_change_carries_no_sign() -> None:
    pairs = [(100.0, 110.0), (100.0, 100.0), (100.0, 105.0), (100.0, 108.0)]
    row = ab._paired_row("cell", ab.METRIC, pairs).split("|")
    p, n = row[5].split()
    assert n == "(3)"  # the round with B = A is left out of the test, not of the median
    assert float(p) == pytest.approx(_brute_force_signed_rank_p(
        [math.log(1.10), math.log(1.05), math.log(1.08)]), abs=5e-4)
    assert float(row[3]) == pytest.approx(1.065, abs=5e-4)


def test_rounds_alternate_and_failures_are_counted(monkeypatch) -> None:
    calls = []

    def fake_run(bench_args, env, json_path):  # noqa: ANN001, ANN202
        side = "B" if env.get("X") == "0" else "A"
        calls.append(side)
        if len(calls) == 4:  # the fourth run fails
            return None
        value = 100.0 if side == "A" else 50.0
        figures = {ab.METRIC: value, ab.CANCELLED: value / 10}
        return {"cell": figures}, {f: 1.0 for f in ab.THREAD_FIGURES}

    monkeypatch.setenv("X", "stale")  # A unsets it, B sets it
    monkeypatch.setattr(ab, "_run", fake_run)
    m = ab.measure([], ["X=0"], 3, Path("/nonexistent"))
    assert calls == ["A", "B", "B", "A", "A", "B"]
    assert m.failed == {"A": 1, "B": 0}
    assert m.runs["cell"] == {"A": [100.0, 100.0], "B": [50.0, 50.0, 50.0]}
    # the round whose A failed has no pair; the other two pair their own A and B
    assert m.pairs[("cell", ab.METRIC)] == [(100.0, 50.0), (100.0, 50.0)]
    assert m.pairs[("cell", ab.CANCELLED)] == [(10.0, 5.0), (10.0, 5.0)]
    text = ab.report(m, ["X=0"], "cmd", "abc")
    assert "Runs that failed (left out): A 1, B 0." in text
    m.runs["gone"] = {"A": [1.0], "B": []}
    assert "| gone | n/a: 1 A run(s), 0 B run(s)" in ab.report(m, ["X=0"], "cmd", "abc")


def test_threads_of_a_child_process_are_read() -> None:
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\n"
                              "input()"], stdin=subprocess.PIPE)
    try:
        seen: dict = {}
        for _ in range(200):  # until the child has burnt its 0.3 s
            ab._sample(os.getpid(), seen)
            if ab._threads({k: v for k, v in seen.items()
                            if k[0] == child.pid})[ab.THREAD_FIGURES[1]] >= 0.3:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        mine = {k: v for k, v in seen.items() if k[0] == child.pid}
        assert child.pid in ab._descendants(os.getpid())
        assert ab._threads(mine)[ab.THREAD_FIGURES[1]] >= 0.3
        assert ab._threads(mine)[ab.THREAD_FIGURES[0]] == 0.0  # no gloo in it
    finally:
        child.kill()
        child.wait()


def test_thread_use_is_summed_by_group_from_the_cells_actions() -> None:
    costs = {"0": {"F": {"wall ms": 25.0, "CPU ms": 20.0, "off core ms": 5.0,
                         "preemptions": 0.3},
                   "B": {"wall ms": 50.0, "CPU ms": 45.0, "off core ms": 5.0,
                         "preemptions": 0.2},
                   "SF": {"wall ms": 5.0, "CPU ms": 1.0, "off core ms": 4.0,
                          "preemptions": 0.05},
                   "RB": {"wall ms": 150.0, "CPU ms": 0.5, "off core ms": 149.5,
                          "preemptions": 0.0}}}
    got = ab._thread_use([{"key": "c", "actions": costs}, {"key": "ddp", "actions": {}}])
    compute, sends = "c w0 compute (F, B, I, W, U)", "c w0 sends (SF, SB, ST)"
    recvs = "c w0 receives (RF, RB, RT)"
    # by hand: F + B; SF alone; the receive (RB) alone, less its time off the core (its wait)
    assert got == pytest.approx({f"{compute} CPU ms": 65.0, f"{compute} off core ms": 10.0,
                                 f"{compute} preemptions": 0.5, f"{sends} CPU ms": 1.0,
                                 f"{sends} off core ms": 4.0, f"{sends} preemptions": 0.05,
                                 f"{recvs} CPU ms": 0.5, f"{recvs} preemptions": 0.0})
    m = ab.Measured()
    for side in ("A", "B"):
        for figure, value in got.items():
            m.threads.setdefault(figure, {"A": [], "B": []})[side].append(value)
    text = ab.report(m, ["X=0"], "cmd", "abc")
    assert f"| {compute} off core ms | 10.000 | 10.000 | 1.00 |" in text
    m.threads["c w1 sends (SF, SB, ST) preemptions"] = {"A": [0.0, 0.0], "B": [0.0, 0.1]}
    text = ab.report(m, ["X=0"], "cmd", "abc")  # no preemption is a measurement, not n/a
    assert "| c w1 sends (SF, SB, ST) preemptions | 0.000 | 0.050 | - |" in text


def test_each_cell_s_peak_memory_gets_a_table_of_its_own() -> None:
    cells = [{"key": "c", "metrics": {"peak_memory_bytes_max": {"median": 43e6}}},
             {"key": "failed", "metrics": {}}]
    got = ab._memory(cells)
    assert got == {f"c{ab.MEMORY}": pytest.approx(43.0)}
    m = ab.Measured()
    m.threads[f"c{ab.MEMORY}"] = {"A": [43.0, 44.0, 42.0], "B": [55.0, 54.0, 56.0]}
    text = ab.report(m, ["X=0"], "cmd", "abc")
    assert f"| c{ab.MEMORY} | 43.0 | 55.0 | 1.28 |" in text
    assert "minor page faults" not in text  # no thread use: memory is not in that table
