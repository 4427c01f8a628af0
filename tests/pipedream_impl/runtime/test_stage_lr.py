"""pipedream_impl/runtime/stage_lr.py: PipeDream's per-stage learning rate, as a rule and on
real gloo processes (a replicated 2-1 pipeline equal to the single-process reference of the
update rule with the rule on and off; the rate a resumed worker takes)."""

from __future__ import annotations

import pytest
import torch

from core.errors import UserInputError
from harness.config import RunConfig
from harness.experiments.pipeline_trainer import PipelineTrainer, system_settings
from harness.reporting.progress import quiet
from pipedream_impl.runtime.stage_lr import STAGE_LR_RULES, stage_lr_scale
from pipedream_impl.schedule import Layout, one_f_one_b
from tests.pipeline_reference import simulate_pipedream
from workloads.registry import get

WL = get("vgg16")
STEPS = 4  # a multiple of lcm(2, 1): every replica runs the same count
REPLICAS, BOUNDS = (2, 1), ((0, 20), (20, 40))
LR = 5e-4  # vgg16 tiny's (Adam)


# -- the rule ---------------------------------------------------------------------------

@pytest.mark.parametrize(("replicas", "expected"), [
    ((1, 1, 1), [1.0, 1.0, 1.0]),
    ((2, 1), [1.0, 0.5]),
    ((3, 1), [1.0, 1 / 3]),
    ((15, 1), [1.0, 1 / 15]),
    ((1, 2), [1.0, 2.0]),
    ((4, 2, 1), [1.0, 0.5, 0.25]),
    ((2, 4, 2), [1.0, 2.0, 1.0]),
    ((5,), [1.0]),
])
def test_replicas_rule_scales_by_replicas_over_the_input_stages(replicas, expected) -> None:
    """Hand-computed: stage s gets lr x r_s / r_0 (the original's get_adjusted_learning_rate),
    so one update of r_s minibatches moves lr / r_0 per minibatch on every stage."""
    got = [stage_lr_scale(replicas, s, "replicas") for s in range(len(replicas))]
    assert got == pytest.approx(expected, rel=1e-12)
    per_minibatch = {g / r for g, r in zip(got, replicas, strict=True)}
    assert max(per_minibatch) == pytest.approx(min(per_minibatch))
    assert [stage_lr_scale(replicas, s, "same") for s in range(len(replicas))] \
        == [1.0] * len(replicas)


def test_unknown_rule_is_refused() -> None:
    assert STAGE_LR_RULES[0] == "replicas"  # the default
    with pytest.raises(ValueError, match="replicas, same"):
        stage_lr_scale((2, 1), 1, "sqrt")
    with pytest.raises(UserInputError, match="--stage-lr"):
        RunConfig.from_flags(system="pipedream", workload="vgg16", workers=3, config="2-1",
                  stage_lr="sqrt")


def test_run_config_reaches_the_executor_and_is_logged() -> None:
    cfg = RunConfig.from_flags(system="pipedream", workload="vgg16", workers=3, config="2-1")
    assert cfg.pipeline.stage_lr == "replicas"
    for rule in STAGE_LR_RULES:
        settings, params = system_settings(RunConfig.from_flags(
            system="pipedream", workload="vgg16", workers=3, config="2-1", stage_lr=rule),
                                           REPLICAS, BOUNDS, 32)
        assert settings.stage_lr == rule and params["stage_lr"] == rule


def test_reference_depends_on_the_rule() -> None:
    """The reference really uses the rule: on 2-1 the two rules give different weights."""
    splits = WL.default_data("tiny", 0)
    model = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    sched = one_f_one_b(Layout(REPLICAS), STEPS, "stash")
    on = simulate_pipedream(WL, "tiny", splits, model, BOUNDS, sched, 32, 0)
    off = simulate_pipedream(WL, "tiny", splits, model, BOUNDS, sched, 32, 0, stage_lr="same")
    a, b = BOUNDS[1]
    diff = max(float((p - q).detach().abs().max()) for p, q in
               zip(on.stage(a, b).parameters(), off.stage(a, b).parameters(), strict=True))
    assert diff > 1e-5


# -- on real processes -------------------------------------------------------------------

@pytest.fixture(scope="module")
def splits():
    return WL.default_data("tiny", 0)


def _trainer(splits, tmp_path, rule: str) -> PipelineTrainer:
    cfg = RunConfig.from_flags(
        system="pipedream", workload="vgg16", scale="tiny", workers=3, threads=1,
        max_steps_per_epoch=STEPS, epochs=2, timeout_s=60, stage_lr=rule,
        checkpoint_dir=str(tmp_path))  # reports carry the optimizer's state
    return PipelineTrainer(cfg, WL, splits, REPLICAS, BOUNDS, torch.device("cpu"), quiet())


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), (n, (p - q).abs().max())


def _lrs(states: list[dict]) -> list[float]:
    return [s["optimizer"]["param_groups"][0]["lr"] for s in states]


@pytest.mark.multiprocess
@pytest.mark.parametrize("rule", STAGE_LR_RULES)
def test_replicated_pipeline_follows_the_reference_with_its_rule(splits, tmp_path,
                                                                 rule: str) -> None:
    t = _trainer(splits, tmp_path, rule)
    try:
        t.train_epoch(0)
    finally:
        t.close()
    # ranks 0, 1: stage 0's replicas; rank 2: stage 1 (hand-computed rates)
    assert _lrs(t.held) == pytest.approx([LR, LR, LR / 2 if rule == "replicas" else LR])
    model = WL.build("tiny", {**splits.train.meta, "init_seed": 0})
    sched = one_f_one_b(Layout(REPLICAS), STEPS, "stash")
    _assert_same(t.model, simulate_pipedream(WL, "tiny", splits, model, BOUNDS, sched, 32, 0,
                                             stage_lr=rule))


@pytest.mark.multiprocess
def test_a_resumed_worker_takes_its_rate_from_the_rule_not_the_checkpoint(splits,
                                                                         tmp_path) -> None:
    """A checkpoint whose param groups hold another rate (one written with one lr
    everywhere, say) resumes at the run's rule, and continues exactly as an uninterrupted
    run: its optimizer state (Adam's moments) and weights come back, its rate does not."""
    straight = _trainer(splits, tmp_path / "a", "replicas")
    resumed = _trainer(splits, tmp_path / "b", "replicas")
    try:
        straight.train_epoch(0)
        workers, own = straight.checkpoint_states()
        workers = [{**w, "optimizer": {**w["optimizer"], "param_groups": [
            {**g, "lr": LR} for g in w["optimizer"]["param_groups"]]}} for w in workers]
        straight.train_epoch(1)
        resumed.restore(workers, own)
        resumed.train_epoch(1)
    finally:
        straight.close()
        resumed.close()
    assert _lrs(resumed.held) == pytest.approx([LR, LR, LR / 2])
    for (n, p), (_, q) in zip(straight.model.named_parameters(),
                              resumed.model.named_parameters(), strict=True):
        assert torch.equal(p, q), n
