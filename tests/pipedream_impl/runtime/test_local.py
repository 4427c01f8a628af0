"""pipedream_impl/runtime/local.py: every rank in one process, with the runtime's own handlers."""

from __future__ import annotations

import pytest
import torch

from core.errors import UserInputError
from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
from pipedream_impl.runtime.local import action_costs, local_executors, run_local, typical_messages
from pipedream_impl.schedule import Layout, one_f_one_b
from tests.pipeline_reference import assert_close, simulate_pipedream
from workloads.registry import get

WL = get("vgg16")
STEPS = 6
BOUNDS = ((0, 10), (10, 25), (25, 40))


def _spec(replicas=(1, 1, 1), bounds=BOUNDS, **kw) -> WorkerSpec:
    return WorkerSpec(0, RunSettings("vgg16", "tiny", 0, 32, max_steps=STEPS, timeout_s=60.0),
                      SystemSettings(replicas, bounds, **kw))


def test_in_process_run_follows_pipedreams_update_rule() -> None:
    """The same handlers, interleaved in one process, give the weights the update rule
    defines (as the multi-process runtime does in test_stage_executor.py), and the action costs
    count every action of the schedule."""
    torch.set_num_threads(1)
    executors = local_executors(_spec())
    reports = run_local(executors, 0)
    splits = WL.default_data("tiny", 0)
    model = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    sched = one_f_one_b(Layout((1, 1, 1)), STEPS, "stash")
    ref = simulate_pipedream(WL, "tiny", splits, model, BOUNDS, sched, 32, 0)
    for ex, (a, b) in zip(executors, BOUNDS, strict=True):
        for (name, p), (_, q) in zip(ex.module.named_parameters(),
                                     ref.stage(a, b).named_parameters(), strict=True):
            assert_close(name, p, q)
    assert len(reports[-1].losses) == STEPS
    costs = action_costs(reports, executors)
    for stage, rep in enumerate(reports):
        # every kind of action in the stage's schedule ran and was timed, and nothing else:
        # stage 0 receives no forward and sends no gradient, the last stage the reverse
        kinds = {a.kind for a in sched.actions[stage]}
        assert set(costs[stage]) == set(rep.action_s) == kinds
        assert ("RF" in kinds) == (stage > 0) and ("SF" in kinds) == (stage < 2)
        assert all(costs[stage][k] > 0 for k in kinds)
        # what each kind cost the thread: booked for the same kinds, and one thread's CPU
        # time within the wall time of its spans (the clocks are read inside them)
        assert set(rep.action_use) == kinds
        for k in kinds:
            cpu_s, sys_s, faults, preemptions = rep.action_use[k]
            assert sys_s >= 0 and 0 <= cpu_s <= rep.action_s[k] * 1.001
            assert faults >= 0 and preemptions >= 0
        assert rep.action_use["F"][0] > 0
    # the messages each stage sent: its output forward, its input's gradient backward
    msgs = typical_messages(executors)
    assert set(msgs) == {(0, "F"), (1, "F"), (1, "B"), (2, "B")}
    for s in (0, 1):
        assert msgs[(s, "F")] == msgs[(s + 1, "B")]  # a cut's activations and gradients
        assert all(shape[0] == 32 for _, shape in msgs[(s, "F")])


def test_replicated_stages_are_refused() -> None:
    with pytest.raises(UserInputError, match="unreplicated"):
        local_executors(_spec(replicas=(2, 1), bounds=((0, 20), (20, 40))))
