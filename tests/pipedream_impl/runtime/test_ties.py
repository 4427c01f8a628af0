"""pipedream_impl/runtime/ties.py: tied parameters across stages (AWD-LM's embedding and
decoder), against closed forms, a whole-model single process and tests/tie_reference.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from core.errors import WorkloadError
from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
from pipedream_impl.runtime.local import local_executors, run_local
from pipedream_impl.runtime.ties import Tie, check_ties, find_ties, with_ties
from pipedream_impl.schedule import Layout, Schedule, gpipe, one_f_one_b, simulate
from tests.tie_reference import train_tied
from workloads.base import Layer, LayerModel
from workloads.recipe import epoch_order, make_optimizer, microbatch
from workloads.registry import get

WL = get("awd-lm")
STEPS = 6
SPLIT = ((0, 2), (2, 5))  # embedding + 1 LSTM | 2 LSTMs + the tied decoder
TIE = (0, "layers.0.encoder.weight", 1, "layers.2.weight")


CLIP = 0.02  # below tiny AWD-LM's gradient norms (about 0.1), so clipping always acts


@pytest.fixture(scope="module")
def splits():
    return WL.default_data("tiny", 0)


@pytest.fixture
def clipped(monkeypatch):
    """Tiny AWD-LM clipping at CLIP and without weight drop, for the tests that run in this
    process (in-process ranks share one random stream; separate processes do not, and the
    multi-process tests below keep the weight drop)."""
    spec = WL.spec("tiny")
    monkeypatch.setitem(WL.scales, "tiny", dataclasses.replace(
        spec, grad_clip=CLIP, model={**spec.model, "wdrop": 0.0}))


def _model(splits) -> LayerModel:
    return WL.build("tiny", {**splits.train.meta, "init_seed": 0})


class _Shared(Layer):
    def __init__(self, p: nn.Parameter) -> None:
        super().__init__()
        self.w = p

    def forward(self, inputs):  # noqa: ANN001, ANN201
        return (inputs[0] * self.w,)


def test_find_ties_names_each_stages_copy(splits) -> None:
    model = _model(splits)
    assert find_ties(model, SPLIT) == (Tie((0, 1), (TIE[1], TIE[3])),)
    assert find_ties(model, ((0, 1), (1, 4), (4, 5))) == \
        (Tie((0, 2), ("layers.0.encoder.weight", "layers.0.weight")),)
    assert find_ties(model, ((0, 5),)) == ()  # one stage: the tie stays one parameter
    assert find_ties(model, ((0, 1), (1, 5))) == (Tie((0, 1), (TIE[1], "layers.3.weight")),)


def test_each_stage_owns_an_identical_copy_and_one_stage_keeps_the_tie(splits) -> None:
    model = _model(splits)
    head, tail = model.stage(*SPLIT[0]), model.stage(*SPLIT[1])
    emb, dec = dict(head.named_parameters())[TIE[1]], dict(tail.named_parameters())[TIE[3]]
    assert emb is not dec and emb.data_ptr() != dec.data_ptr() and torch.equal(emb, dec)
    whole = model.stage(0, 5)
    assert whole.layers[0].encoder.weight is whole.layers[4].weight
    with torch.no_grad():
        emb.add_(1.0)  # a copy: the other stage and the whole model are untouched
    assert torch.equal(dec, model.layers[4].weight)


def test_what_the_rule_does_not_cover_is_refused(splits) -> None:
    model = _model(splits)
    with pytest.raises(WorkloadError, match="must be unreplicated"):
        check_ties(model, SPLIT, (2, 1))
    p, q = nn.Parameter(torch.ones(1)), nn.Parameter(torch.ones(1))
    three = LayerModel([_Shared(p), _Shared(p), _Shared(p)])
    with pytest.raises(WorkloadError, match="at most two stages"):
        find_ties(three, ((0, 1), (1, 2), (2, 3)))
    pairs = LayerModel([_Shared(p), _Shared(q), _Shared(p), _Shared(q)])
    with pytest.raises(WorkloadError, match="same two stages"):
        check_ties(pairs, ((0, 1), (1, 2), (2, 3), (3, 4)), (1, 1, 1, 1))
    assert check_ties(pairs, ((0, 2), (2, 4)), (1, 1)) != ()


N = 12


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_pipedream_plan_is_the_closed_form(stages: int) -> None:
    """1F1B (NOAM: stage s runs S - s warm-up forwards): u(i) = i + b - a + 1 while stage a
    has a forward after its backward of i, else the epoch's last update; flush schedules
    and one minibatch in flight: u(i) = i (Megatron's sum before the step)."""
    layout = Layout((1,) * stages)
    for a in range(stages):
        for b in range(a + 1, stages):
            _, plan = with_ties(one_f_one_b(layout, N), (a, b))
            assert plan.applied_at == tuple(i + b - a + 1 if i + stages - a < N else N - 1
                                            for i in range(N)), (a, b)
            assert not plan.joint
            for sync in (one_f_one_b(layout, N, in_flight=1), gpipe(layout, N, 3)):
                _, plan = with_ties(sync, (a, b))
                assert plan.applied_at == tuple(range(N)) and plan.joint


def _compute_times(sched: Schedule) -> list[list[tuple]]:
    return [[(s, e, str(x)) for s, e, x in row if x.kind in ("F", "B")]
            for row in simulate(sched)]


@pytest.mark.parametrize("replicas, weights", [((1, 1), "stash"), ((1, 1, 1, 1), "stash"),
                                               ((1, 1, 1), "vertical-sync"),
                                               ((2, 1, 1), "stash")])
def test_tie_messages_never_delay_a_forward_or_backward(replicas, weights: str) -> None:
    """With free messages, every F and B runs when it would without the tie; Megatron's
    synchronous sum at every update of 1F1B would delay them (hence the rule)."""
    layout, last = Layout(replicas), len(replicas) - 1
    base = one_f_one_b(layout, N, weights)
    tied, _ = with_ties(base, (1 if replicas[0] > 1 else 0, last))
    assert _compute_times(tied) == _compute_times(base)
    if replicas[0] == 1:
        ra, rb = 0, layout.workers - 1
        acts = [list(x) for x in base.actions]
        from pipedream_impl.schedule import Action
        for r, peer in ((ra, rb), (rb, ra)):
            ups = [p for p, x in enumerate(acts[r]) if x.kind == "U"]
            for j in range(len(ups) - 1, -1, -1):
                acts[r][ups[j]:ups[j]] = [Action("ST", j, peer=peer), Action("RT", j, peer=peer)]
        megatron = Schedule(layout, N, weights, tuple(tuple(x) for x in acts))
        assert _compute_times(megatron) != _compute_times(base)


@pytest.mark.parametrize("sched", [one_f_one_b(Layout((1, 1)), N),
                                   one_f_one_b(Layout((1, 1, 1)), N, in_flight=1),
                                   gpipe(Layout((1, 1)), 4, 3)])
def test_each_link_receives_in_the_order_it_sends(sched: Schedule) -> None:
    """An in-order transport (NCCL) matches messages by order per link, not by tag."""
    tied, _ = with_ties(sched, (0, len(sched.layout.replicas) - 1))
    for src, acts in enumerate(tied.actions):
        for dst in range(len(tied.actions)):
            sent = [(x.kind[1], x.mb) for x in acts if x.kind[0] == "S" and x.peer == dst]
            got = [(x.kind[1], x.mb) for x in tied.actions[dst]
                   if x.kind[0] == "R" and x.peer == src]
            assert sent == got, (src, dst)


def _no_dropout(model: LayerModel) -> LayerModel:
    for layer in model.layers:
        if hasattr(layer, "weight_drop"):
            layer.weight_drop = 0.0
    return model


def test_flush_rule_is_whole_minibatch_training_in_one_process(splits, clipped) -> None:
    """The reference of the rule with u(i) = i and joint clipping, on GPipe's microbatches,
    equals plain training of the whole (truly tied) model on whole minibatches, global norm
    clipping included."""
    sched = gpipe(Layout((1, 1)), STEPS, 2)
    stages = train_tied(WL, "tiny", splits, _no_dropout(_model(splits)), SPLIT, sched, TIE,
                        list(range(STEPS)), 32, 0, joint=True)
    model = _no_dropout(_model(splits))
    spec = WL.spec("tiny")
    opt = make_optimizer(spec, model.parameters())
    order = epoch_order(len(splits.train), 0, 0)
    for t in range(STEPS):
        batch = microbatch(splits.train, WL, order, t, 0, 32, 1)
        WL.loss(model(batch.inputs), batch.targets).backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        assert norm > spec.grad_clip  # clipping matters here
        opt.step()
        opt.zero_grad()
    for s, (lo, _) in enumerate(SPLIT):
        for name, p in stages[s].named_parameters():
            _, i, rest = name.split(".", 2)
            want = model.get_parameter(f"layers.{lo + int(i)}.{rest}")
            assert torch.allclose(p, want, rtol=1e-4, atol=1e-6), name


def _spec(**kw) -> WorkerSpec:
    return WorkerSpec(0, RunSettings("awd-lm", "tiny", 0, 32, max_steps=STEPS, timeout_s=60.0),
                      SystemSettings((1, 1), SPLIT, **kw))


def _reference(splits, sched: Schedule, applied_at: list[int], joint: bool):
    return train_tied(WL, "tiny", splits, _model(splits), SPLIT, sched, TIE, applied_at, 32, 0,
                      joint)


def _assert_states(states: list[dict], ref: list[nn.Module]) -> None:
    for state, st in zip(states, ref, strict=True):
        for name, p in st.named_parameters():
            assert torch.allclose(state[name], p, rtol=1e-4, atol=1e-6), name


PLANS = {  # system settings -> (schedule, u(i) by the closed forms above, joint clipping)
    "pipedream": ({}, one_f_one_b(Layout((1, 1)), STEPS),
                  [min(i + 2, STEPS - 1) for i in range(STEPS)], False),
    "vertical-sync": ({"weights": "vertical-sync"},
                      one_f_one_b(Layout((1, 1)), STEPS, "vertical-sync"),
                      [min(i + 2, STEPS - 1) for i in range(STEPS)], False),
    "model-parallel": ({"in_flight": 1}, one_f_one_b(Layout((1, 1)), STEPS, in_flight=1),
                       list(range(STEPS)), True),
    "gpipe": ({"schedule": "flush", "microbatches": 2}, gpipe(Layout((1, 1)), STEPS, 2),
              list(range(STEPS)), True),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_in_process_runtime_follows_the_rule(splits, clipped, name: str) -> None:
    """The runtime's own handlers (every rank in this process) give both copies the
    reference's weights, bit-identical to each other; the other clipping rule would not."""
    torch.set_num_threads(1)
    kw, sched, applied_at, joint = PLANS[name]
    executors = local_executors(_spec(**kw))
    run_local(executors, 0)
    states = [dict(ex.module.named_parameters()) for ex in executors]
    assert torch.equal(states[0][TIE[1]], states[1][TIE[3]])
    _assert_states(states, _reference(splits, sched, applied_at, joint))
    with pytest.raises(AssertionError):
        _assert_states(states, _reference(splits, sched, applied_at, not joint))
    initial = _model(splits).layers[0].encoder.weight
    assert not torch.allclose(states[0][TIE[1]], initial)


MULTI = {"pipedream": {}, "gpipe": {"microbatches": 2}, "model-parallel": {}}


@pytest.mark.multiprocess
@pytest.mark.parametrize("system", list(MULTI))
def test_two_workers_train_awd_lm_by_the_rule(splits, system: str) -> None:
    """AWD-LM tiny (weight drop on: each rank's own stream, as the reference draws it) on
    two worker processes, embedding and decoder on different stages: both copies equal
    each other bit for bit after the epoch and equal the reference; the tie messages are
    counted on the links."""
    from harness.config import RunConfig
    from harness.experiments.pipeline_trainer import PipelineTrainer
    from harness.reporting.progress import quiet

    cfg = RunConfig.from_flags(system=system, workload="awd-lm", scale="tiny", workers=2, threads=1,
                    max_steps_per_epoch=STEPS, epochs=1, timeout_s=60, **MULTI[system])
    trainer = PipelineTrainer(cfg, WL, splits, (1, 1), SPLIT, torch.device("cpu"), quiet())
    try:
        stats = trainer.train_epoch(0)
    finally:
        trainer.close()
    states = [trainer.replica_states[0], trainer.replica_states[1]]
    assert torch.equal(states[0][TIE[1]], states[1][TIE[3]])
    _, sched, applied_at, joint = PLANS[system]
    _assert_states(states, _reference(splits, sched, applied_at, joint))
    assert stats.steps == STEPS
    if system == "pipedream":  # activations + the embedding's gradient; gradients + decoder's
        model = _model(splits)
        batch = WL.make_batch(splits.train, torch.arange(32))
        with torch.no_grad():
            act = sum(t.numel() * t.element_size() for t in model.stage(*SPLIT[0])(batch.inputs))
        tied = model.layers[0].encoder.weight.numel() * 4
        assert trainer.metrics.links[(0, 1)] == STEPS * (act + tied)
        assert trainer.metrics.links[(1, 0)] == STEPS * (act + tied)


def test_link_order_check_refuses_receives_out_of_the_senders_order() -> None:
    """NCCL pairs point-to-point messages by order, not tag: a tie gradient received
    before an activation that was sent first would be read as the activation."""
    from core.errors import ScheduleError
    from pipedream_impl.runtime.ties import check_link_order
    from pipedream_impl.schedule import Layout, Schedule, parse_action

    def sched(rank1: str) -> Schedule:
        r0 = tuple(parse_action(x) for x in "F0v0 SF0>1 ST0>1".split())
        r1 = tuple(parse_action(x) for x in rank1.split())
        return Schedule(Layout((1, 1)), 1, "stash", (r0, r1))

    check_link_order(sched("RF0<0 RT0<0 F0v0"))  # the sender's order: fine
    with pytest.raises(ScheduleError, match="link 0 -> 1"):
        check_link_order(sched("RT0<0 RF0<0 F0v0"))
