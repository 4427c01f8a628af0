"""reproduce validation's diagnosis columns (harness/sim/validation_compute.py, and the
report of harness/sim/validation.py): each stage's compute
in the run over the same measured alone, and the same per kind of action, from figures
worked out by hand."""

from __future__ import annotations

import os

import pytest

from harness import metrics
from harness.sim.validation import ValidationRow
from harness.sim.validation_compute import (
    comm_counts,
    comm_in_run,
    compute_in_run,
    cpu_of_kinds,
    kinds_in_run,
    scale_compute,
)
from harness.sim.validation_report import markdown


def _measured(stage: int) -> str:
    return metrics.key(metrics.STAGE_MEASURED, stage=stage)


def test_the_ratio_is_the_run_per_minibatch_over_m_units_and_one_update_alone() -> None:
    actions = {0: {"F": 0.001, "B": 0.002, "U": 0.0005},  # alone: 4 x 3 + 0.5 = 12.5 ms
               1: {"F": 0.001, "I": 0.001, "W": 0.0015, "U": 0.001}}  # 4 x 3.5 + 1 = 15 ms
    final = {_measured(0): 16.25, _measured(1): 13.5, "busy_s_worker_0": 1.0}
    got = compute_in_run(actions, final, microbatches=4)
    assert got == {0: pytest.approx(1.3), 1: pytest.approx(0.9)}
    # a stage the run did not time (data parallelism times none): no diagnosis at all
    assert compute_in_run(actions, {_measured(0): 16.25}, 4) == {}
    assert compute_in_run({0: {"F": 0.0, "B": 0.0}}, {_measured(0): 1.0}, 4) == {}


def _timed(kind: str, worker: int) -> str:
    return metrics.key(metrics.ACTION_TIME, kind=kind, worker=worker)


def test_each_kind_gets_its_share_of_the_stage_s_run_time_over_its_cost_alone() -> None:
    actions = {0: {"F": 0.001, "B": 0.002, "U": 0.0005, "SF": 0.003}}  # alone: 12.5 ms
    # the run: 16.25 ms of compute per minibatch (ratio 1.3), timed 6 : 9 : 1 s by kind,
    # so F 16.25 x 6/16 = 6.09375 ms over 4 x 1 ms, B 9.140625 over 4 x 2, U 1.015625 over
    # one 0.5 ms update
    final = {_measured(0): 16.25, _timed("F", 0): 6.0, _timed("B", 0): 9.0,
             _timed("U", 0): 1.0, _timed("SF", 0): 50.0}  # a send is not compute
    got = kinds_in_run(actions, final, 4, (1,))
    assert got == {0: {"F": pytest.approx(1.5234375), "B": pytest.approx(1.142578125),
                       "U": pytest.approx(2.03125)}}
    # the kinds' costs scaled by their own ratios, the transfer left as it was; a stage
    # with no kinds of its own takes its stage's ratio
    both = {**actions, 1: {"F": 0.002, "U": 0.001}}
    scaled = scale_compute(both, {0: 1.3, 1: 2.0}, got)
    assert scaled == {0: {"F": pytest.approx(0.0015234375), "B": pytest.approx(0.00228515625),
                          "U": pytest.approx(0.001015625), "SF": 0.003},
                      1: {"F": 0.004, "U": 0.002}}
    # replicated stages (rank is not stage), a worker that timed nothing, one that did not
    # time a kind its stage has, or one that timed a kind its stage has no cost for: no
    # split (a missing kind would otherwise be scaled to nothing)
    assert kinds_in_run(actions, final, 4, (2,)) == {}
    assert kinds_in_run(actions, {_measured(0): 16.25}, 4, (1,)) == {}
    no_update = {k: v for k, v in final.items() if k != _timed("U", 0)}
    assert kinds_in_run(actions, no_update, 4, (1,)) == {}
    assert kinds_in_run(actions, {**final, _timed("W", 0): 2.0}, 4, (1,)) == {}
    unmeasured = {k: v for k, v in final.items() if k != _measured(0)}  # no stage figure
    assert kinds_in_run(actions, unmeasured, 4, (1,)) == {}


def test_the_report_shows_the_ratio_and_the_error_left_once_it_is_known() -> None:
    row = ValidationRow("vgg16", "pipedream-flush", 2, "1-1", measured=400.0,
                        simulated=520.0, measured_bubble=0.3, simulated_bubble=0.2,
                        compute_in_run=(1.3, 1.25), resimulated=420.0,
                        kinds_in_run=({"F": 1.5, "U": 0.9}, {"F": 1.25}), unloaded=460.0,
                        with_comm=412.0, with_cpu=428.0)
    dp = ValidationRow("vgg16", "ddp", 2, "2", measured=500.0, simulated=520.0)
    text = markdown([row, dp], {"latency_s": 5e-5, "bandwidth_Bps": 3e9, "cores": 2},
                    "pipebench reproduce validation")
    line = next(ln for ln in text.splitlines() if "pipedream-flush" in ln)
    assert ("| +30% | 1.30 (F 1.50 U 0.90) / 1.25 (F 1.25) | 420 (+5%) | 412 (+3%) | "
            "428 (+7%) | 460 (+15%) |") in line
    assert "| +4% | - | - | - | - | - |" in next(ln for ln in text.splitlines() if "| ddp |" in ln)
    assert ("At 2 worker(s): 1 of 2 within 10% (goal: all); median |error| 17%, worst 30%; "
            "with the run's own compute 1 of 1 within 10%, median |error| 5%; with its sends "
            "and receives too 1 of 1 within 10%, median |error| 3%; with the run's CPU per "
            "action on shared cores 1 of 1 within 10%, median |error| 7%; with idle-core "
            "transfers, of the rows that measured them 0 of 1 within 10%, median |error| "
            "15%.") in text


def test_the_report_names_the_runtime_switches_its_runs_had(monkeypatch) -> None:  # noqa: ANN001
    """Runs under a switch (e.g. PIPEBENCH_NO_HALT) are not the defaults' runs: the header
    says so; with the defaults it says nothing of switches."""
    for name in ("PIPEBENCH_RECV_AHEAD", "PIPEBENCH_SETTLE_SENDS", "PIPEBENCH_ALLREDUCE_BUCKET_MB",
                 "PIPEBENCH_PIN", "PIPEBENCH_NO_HALT", "PIPEBENCH_TRANSPORT_YIELD"):
        monkeypatch.delenv(name, raising=False)
    machine = {"latency_s": 5e-5, "bandwidth_Bps": 3e9, "cores": 2}
    dp = ValidationRow("vgg16", "ddp", 2, "2", measured=500.0, simulated=520.0)
    assert "runtime switches" not in markdown([dp], machine, "cmd")
    monkeypatch.setenv("PIPEBENCH_PIN", "1")
    assert "Generated by `cmd` with the runtime switches PIPEBENCH_PIN=1; " in markdown(
        [dp], machine, "cmd")


def test_the_report_names_its_machine_commit_and_torch() -> None:
    """Validation pages of two machines differ by several times in throughput: each names
    the processor it ran on (read here from /proc/cpuinfo), the commit and torch."""
    from pathlib import Path

    import torch

    model = next(line.split(":", 1)[1].strip()
                 for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name"))
    machine = {"latency_s": 5e-5, "bandwidth_Bps": 3e9, "cores": 2}
    dp = ValidationRow("vgg16", "ddp", 2, "2", measured=500.0, simulated=520.0)
    head = markdown([dp], machine, "cmd").splitlines()[2]
    assert f"; {model}, {os.cpu_count()} cores; git " in head
    assert f"; torch {torch.__version__}. Measured:" in head


def test_the_runs_own_send_and_receive_times_are_per_unit_over_every_epoch() -> None:
    """A flush pipeline of 2 stages sends and receives one message per microbatch each
    way: 8 x 4 per epoch. Sends are charged their whole time in the run, receives their
    CPU time (their wall time holds the wait); over the epochs' worth of minibatches the
    run did, warm-up included."""
    from harness import systems

    counts = comm_counts(systems.simulated("pipedream-flush"), (1, 1), 4, 8)
    assert counts == {0: {"SF": 32, "RB": 32}, 1: {"SB": 32, "RF": 32}}
    final = {"action_s_SF_worker_0": 0.064, "action_s_SB_worker_1": 0.128,
             "action_cpu_s_RB_worker_0": 0.032, "action_cpu_s_RF_worker_1": 0.016,
             "action_s_RB_worker_0": 9.0, "action_s_RF_worker_1": 9.0}
    sends, recvs = comm_in_run(final, counts, 2.0)
    assert sends == {(0, "F"): pytest.approx(0.001), (1, "B"): pytest.approx(0.002)}
    assert recvs == {(0, "B"): pytest.approx(0.0005), (1, "F"): pytest.approx(0.00025)}
    no_cpu = {k: v for k, v in final.items() if not k.startswith("action_cpu_s_RF")}
    assert comm_in_run(no_cpu, counts, 2.0) == ({}, {})
    assert comm_in_run(final, counts, 1.0)[0][(0, "F")] == pytest.approx(0.002)


def test_each_kind_s_cpu_ratio_is_its_ratio_times_its_share_on_a_core() -> None:
    """A kind whose worker's main thread was on a core for 3/4 of the seconds it timed
    it: its CPU ratio is 3/4 of its wall ratio; a send charged by its CPU time in the
    CPU variant; a kind whose CPU the run did not log: no diagnosis."""
    per_kind = {0: {"F": 1.6, "B": 1.2}, 1: {"F": 2.0}}
    final = {_timed("F", 0): 4.0, metrics.key(metrics.ACTION_CPU, kind="F", worker=0): 3.0,
             _timed("B", 0): 2.0, metrics.key(metrics.ACTION_CPU, kind="B", worker=0): 2.0,
             _timed("F", 1): 1.0, metrics.key(metrics.ACTION_CPU, kind="F", worker=1): 0.5}
    assert cpu_of_kinds(per_kind, final) == {0: {"F": pytest.approx(1.2),
                                                 "B": pytest.approx(1.2)},
                                             1: {"F": pytest.approx(1.0)}}
    lost = {k: v for k, v in final.items() if k != _timed("F", 1)}
    assert cpu_of_kinds(per_kind, lost) == {}
    assert cpu_of_kinds({}, final) == {}
    counts = {0: {"SF": 32, "RB": 32}}
    comm = {"action_s_SF_worker_0": 0.064, "action_cpu_s_SF_worker_0": 0.016,
            "action_cpu_s_RB_worker_0": 0.032}
    assert comm_in_run(comm, counts, 2.0, cpu=True)[0] == {(0, "F"): pytest.approx(0.00025)}
    assert comm_in_run(comm, counts, 2.0)[0] == {(0, "F"): pytest.approx(0.001)}
