"""scripts/wake_cost.py: its table on figures worked out by hand, its count of the CPUs'
halts on a sysfs tree written here, and its two processes taking turns to the end.

Why: results/wake-cost.md answers whether a worker computes slower after it slept (issue
24's open question about the VM's idle halts); its ratios and halt rates must be what the
report says they are, and a mode whose processes deadlocked would report nothing.
"""

from __future__ import annotations

import os

import pytest

from tests.scripts import SCRIPTS, load_script

wc = load_script("wake_cost")


def test_each_round_is_judged_against_alone_in_the_same_round() -> None:
    got = {"alone": [(1.0, 10.0), (2.0, 30.0)], "block": [(1.1, 400.0), (2.4, 600.0)],
           "spin": [(1.1, 0.0), (1.8, 2.0)], "block+dma0": []}
    rows = wc.table(got)
    # alone over block: 1 / 1.1 and 2 / 2.4
    assert rows[0] == ("alone", "1.000 2.000", "1.00 (1.00-1.00)", "0.87 (0.83-0.91)", "20")
    # 1.1 / 1.0 and 2.4 / 2.0: 1.1 and 1.2, median 1.15 (not 3.5 / 3.0 of the pooled sums)
    assert rows[1] == ("block", "1.100 2.400", "1.15 (1.10-1.20)", "1.00 (1.00-1.00)", "500")
    # spin: 1.1 and 0.9 over alone, 1.0 and 0.75 over block
    assert rows[2] == ("spin", "1.100 1.800", "1.00 (0.90-1.10)", "0.88 (0.75-1.00)", "1")
    assert rows[3] == ("block+dma0", "not run (no permission)", "-", "-", "-")


def test_halts_count_every_idle_state_but_polling(tmp_path) -> None:  # noqa: ANN001
    for cpu, states in (("cpu0", [("POLL", 100), ("haltpoll idle", 7)]),
                        ("cpu1", [("POLL", 50), ("C1", 2), ("C2", 3)])):
        for i, (name, usage) in enumerate(states):
            d = tmp_path / cpu / "cpuidle" / f"state{i}"
            d.mkdir(parents=True)
            (d / "name").write_text(name + "\n")
            (d / "usage").write_text(f"{usage}\n")
    (tmp_path / "cpufreq").mkdir()  # not a CPU
    assert wc.halts(tmp_path) == 12


@pytest.mark.multiprocess
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
@pytest.mark.parametrize("mode", ["block", "spin"])
def test_the_two_processes_take_their_turns_to_the_end(mode: str, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the spawned children import the script
    ms, rate = wc._run(mode, 30)  # 30 turns each; a lost token would end in queue.Empty
    assert 0 < ms < 1000 and rate >= 0
