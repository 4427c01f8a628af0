"""pipedream_impl/planner/depths.py: minibatches in flight per stage, deep enough for a plan's
transfers, checked by hand on small plans and against the simulator's replay of the
runtime's schedule (an event engine that knows nothing of the rule) on random ones."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from core.errors import UserInputError
from harness.sim.simulator import SimOptions, layout_for, simulate_system
from pipedream_impl.planner.cluster import Cluster, Level
from pipedream_impl.planner.depths import (
    WORTH,
    cut_seconds,
    deepest,
    engine_period,
    transfer_depths,
)
from pipedream_impl.planner.plan import Plan, plan_profile
from pipedream_impl.schedule.actions import stage_depths
from tests.harness.sim.test_planner_gap import MB, chain


def test_the_rule_deepens_the_stage_before_a_slow_cut_by_hand() -> None:
    # stage 1 computes 30 ms per minibatch and the cut takes 10 ms each way at a 30 ms
    # period: stage 0 must hold D_1 - r_1 + (30 + 20) / 30 + r_0 = 1 - 1 + 1.67 + 1 -> 3
    assert deepest((1, 1), [30e-3, 30e-3], [10e-3], 30e-3) == (3, 1)
    # the same cut free: PipeDream's depths (2, 1)
    assert deepest((1, 1), [30e-3, 30e-3], [0.0], 30e-3) == (2, 1)
    # three stages, only the last cut slow: both earlier stages hold one more
    assert deepest((1, 1, 1), [1e-3, 1e-3, 1e-3], [0.0, 1e-3], 1e-3) == (5, 4, 1)


def test_the_engine_keeps_the_deeper_depths_only_where_the_default_waits() -> None:
    # F 10 ms, B 20 ms on both stages, 10 ms each way: with 2 in flight stage 0 waits for
    # a round trip of 10 + 10 + 10 + 20 + 10 + 20 = 80 ms per 2 minibatches (40 ms each)
    f, b = [10e-3, 10e-3], [20e-3, 20e-3]
    assert engine_period((1, 1), (2, 1), f, b, [10e-3]) == pytest.approx(40e-3)
    assert engine_period((1, 1), (3, 1), f, b, [10e-3]) == pytest.approx(30e-3)
    assert transfer_depths((1, 1), f, b, [10e-3], 30e-3) == (3, 1)
    # stage 0 at a third of the period: its slack covers the cut, so the default stays
    # (the rule alone would deepen it: it waits on no stage's slack)
    f0 = [10e-3 / 3, 10e-3]
    b0 = [20e-3 / 3, 20e-3]
    assert deepest((1, 1), [10e-3, 30e-3], [10e-3], 30e-3) == (3, 1)
    assert engine_period((1, 1), (2, 1), f0, b0, [10e-3]) == pytest.approx(30e-3)
    assert transfer_depths((1, 1), f0, b0, [10e-3], 30e-3) == (2, 1)


def test_free_cuts_never_ask_more_than_the_schedules_own_rule() -> None:
    rng = random.Random(3)
    for _ in range(200):
        reps = tuple(rng.randint(1, 4) for _ in range(rng.randint(2, 5)))
        period = rng.uniform(1e-3, 5e-3)
        compute = [rng.uniform(0, period * r) for r in reps]  # no stage above the period
        assert deepest(reps, compute, [0.0] * (len(reps) - 1), period) == \
            stage_depths(reps), reps
        assert transfer_depths(reps, [c / 3 for c in compute], [2 * c / 3 for c in compute],
                               [0.0] * (len(reps) - 1), period) == stage_depths(reps)


def test_the_cut_crosses_the_innermost_level_holding_both_ranks() -> None:
    cl = Cluster((Level(4, 10e9), Level(2, 1e9)))
    assert cl.link_level(0, 3) == 0 and cl.link_level(3, 4) == 1 and cl.link_level(5, 7) == 0
    # replicas route k mod r: ranks (2, 3) to (4,): minibatch 0 crosses servers, 1 too
    assert cut_seconds(cl, 1e9, (0, 1), (2,)) == pytest.approx(0.1)
    assert cut_seconds(cl, 1e9, (2, 3), (4,)) == pytest.approx(1.0)


def test_a_plan_records_its_depths_and_a_plan_file_is_checked() -> None:
    prof = chain([10.0, 10.0], [1 * MB, 0.5 * MB], [0.0, 0.0])
    plan = plan_profile(prof, Cluster((Level(2, 100 * MB),)), straight=True)
    assert plan.depths == (3, 1)  # the cut's 1 MB takes 10 ms each way: the case above
    again = Plan.from_json(plan.to_json())
    assert again.depths == (3, 1)
    d = json.loads(plan.to_json())
    del d["depths"]  # a plan from before depths: the schedule's default
    assert Plan.from_json(json.dumps(d)).depths == ()
    for bad in ([3], [3, "1"], [2, 0]):
        with pytest.raises(UserInputError, match="depths"):
            Plan.from_json(json.dumps({**d, "depths": bad}))


def test_a_memory_limit_the_deeper_stash_would_break_keeps_the_default_depths() -> None:
    # stage 0 holds its 1 MB of activations once per minibatch in flight: 3 MB at depth 3
    prof = chain([10.0, 10.0], [1 * MB, 0.5 * MB], [0.0, 0.0])
    cl = Cluster((Level(2, 100 * MB),))
    roomy = plan_profile(prof, cl, straight=True, memory_limit=3.5 * MB)
    assert roomy.depths == (3, 1) and "depths" not in roomy.extra
    tight = plan_profile(prof, cl, straight=True, memory_limit=2.5 * MB)
    assert tight.depths == () and tight.extra["depths"] == "default (memory limit)"
    assert Plan.from_json(tight.to_json()).depths == ()


def _random_plan(rng: random.Random) -> tuple:
    n = rng.randint(3, 8)
    prof = chain([rng.uniform(1, 20) for _ in range(n)],
                 [rng.uniform(0.1, 5) * MB for _ in range(n)],
                 [rng.choice([0.0, rng.uniform(0.1, 20) * MB]) for _ in range(n)])
    if rng.random() < 0.7:
        cl = Cluster((Level(rng.randint(2, 6), rng.uniform(50, 2000) * MB),))
    else:
        cl = Cluster((Level(rng.randint(2, 4), rng.uniform(200, 4000) * MB),
                      Level(rng.randint(2, 3), rng.uniform(50, 500) * MB)))
    straight = rng.random() < 0.4 and cl.workers <= n
    return prof, cl, plan_profile(prof, cl, straight=straight)


def test_random_plans_run_at_their_planned_time_with_their_depths() -> None:
    """The runtime's schedule, replayed by the simulator with the plan's depths, runs
    within ``WORTH`` of the planned time per minibatch; with PipeDream's default depths
    some plans run slower (the rule's reason to exist), and none runs faster."""
    rng = random.Random(11)
    pipelines = slower_by_default = 0
    for _ in range(100):
        prof, cl, plan = _random_plan(rng)
        if len(plan.stages) < 2:
            continue
        pipelines += 1
        layout = layout_for(prof, cl, "pipedream", plan=plan)
        o = SimOptions(minibatches=240)
        ours = simulate_system(prof, cl, "pipedream", layout, o).time_per_minibatch_s
        default = simulate_system(prof, cl, "pipedream", replace(layout, depths=None),
                                  o).time_per_minibatch_s
        planned = plan.predicted["time_per_minibatch_s"]
        # the engine's view leaves out links shared and all-reduces: a point of slack
        assert ours <= planned * (1 + WORTH + 0.01), (plan.config, plan.depths, ours / planned)
        assert ours <= default * (1 + 1e-9)
        slower_by_default += default > planned * (1 + WORTH)
    assert pipelines >= 30 and slower_by_default >= 3, (pipelines, slower_by_default)
