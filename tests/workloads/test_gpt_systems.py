"""The GPT workloads under every kind of system on two real worker processes, each against
a single-process reference of its update rule (as the other workloads are tested):
whole-minibatch SGD for the flush pipelines, data parallelism, the torch peers and
DeepSpeed; the weight-stashing rule for PipeDream; the optimizer's step at W(t) on
grad f(W(t-1)) for PipeDream-2BW; and, for the GPT-2 variant whose head is the embedding,
the tie rule with the embedding and the head on different stages."""

from __future__ import annotations

import pytest
import torch

from harness.config import RunConfig
from harness.experiments.pipeline_trainer import PipelineTrainer
from harness.reporting.progress import quiet
from pipedream_impl.schedule import Layout, gpipe, one_f_one_b
from tests.pipeline_reference import (
    assert_same,
    simulate_pipedream,
    single_process_reference,
    two_bw_reference,
)
from tests.tie_reference import train_tied
from workloads.registry import get

pytestmark = pytest.mark.multiprocess

STEPS, BATCH = 4, 32
SPLIT = ((0, 3), (3, 6))  # embedding + 2 blocks | 2 blocks + the head
LLAMA, GPT2 = get("gpt-llama"), get("gpt")
TIE = (0, "layers.0.tokens.weight", 1, "layers.2.weight")  # GPT-2: embedding | head


@pytest.fixture(scope="module")
def splits():
    return LLAMA.default_data("tiny", 0)  # both variants read the same token stream


@pytest.fixture(scope="module")
def sequential(splits):
    return single_process_reference(LLAMA, splits, STEPS)[0]


def _train(workload, splits, system: str, replicas=(1, 1), bounds=SPLIT,  # noqa: ANN001
           **kw) -> PipelineTrainer:
    cfg = RunConfig.from_flags(system=system, workload=workload.name, scale="tiny",
                               workers=sum(replicas), threads=1, max_steps_per_epoch=STEPS,
                               epochs=1, timeout_s=60, **kw)
    t = PipelineTrainer(cfg, workload, splits, replicas, bounds, torch.device("cpu"), quiet())
    try:
        stats = t.train_epoch(0)
    finally:
        t.close()
    assert stats.steps == STEPS
    return t


@pytest.mark.parametrize("system", ["gpipe", "torch-gpipe", "torch-1f1b", "deepspeed-pipe"])
def test_flush_pipelines_equal_whole_minibatch_training(splits, sequential,
                                                        system: str) -> None:
    """Flush per minibatch, 4 microbatches' gradients averaged: whole-minibatch training
    (DeepSpeed's engine on the untied Llama variant, as the issue asks of the peers)."""
    assert_same(_train(LLAMA, splits, system, microbatches=4).model, sequential)


@pytest.mark.parametrize("system", ["ddp", "horovod"])
def test_data_parallelism_equals_whole_minibatch_training(splits, sequential,
                                                          system: str) -> None:
    n = len(LLAMA.build("tiny", splits.train.meta).layers)
    assert_same(_train(LLAMA, splits, system, (2,), ((0, n),)).model, sequential)


def test_pipedream_follows_the_weight_stashing_rule(splits) -> None:
    pipe = _train(LLAMA, splits, "pipedream")
    model = LLAMA.build("tiny", {**splits.train.meta, "init_seed": 0})
    ref = simulate_pipedream(LLAMA, "tiny", splits, model, SPLIT,
                             one_f_one_b(Layout((1, 1)), STEPS), BATCH, 0)
    assert_same(pipe.model, ref)
    initial = LLAMA.build("tiny", {**splits.train.meta, "init_seed": 0})
    assert not torch.allclose(initial.layers[0].tokens.weight, pipe.model.layers[0].tokens.weight)


def test_pipedream_2bw_follows_the_delayed_update_rule(splits) -> None:
    pipe = _train(LLAMA, splits, "pipedream-2bw", microbatches=2)
    assert_same(pipe.model, two_bw_reference(LLAMA, splits, STEPS, BATCH))


@pytest.mark.parametrize("system", ["pipedream", "gpipe"])
def test_gpt2_tied_head_on_another_stage_follows_the_tie_rule(splits, system: str) -> None:
    """Embedding on stage 0, head on stage 1: both copies equal each other bit for bit and
    the tie reference (PipeDream's tied gradient applied two updates later at stage 0,
    GPipe's at once)."""
    kw = {"microbatches": 2} if system == "gpipe" else {}
    pipe = _train(GPT2, splits, system, **kw)
    states = [pipe.replica_states[0], pipe.replica_states[1]]
    assert torch.equal(states[0][TIE[1]], states[1][TIE[3]])
    if system == "gpipe":
        sched, applied_at = gpipe(Layout((1, 1)), STEPS, 2), list(range(STEPS))
    else:
        sched = one_f_one_b(Layout((1, 1)), STEPS)
        applied_at = [min(i + 2, STEPS - 1) for i in range(STEPS)]
    model = GPT2.build("tiny", {**splits.train.meta, "init_seed": 0})
    ref = train_tied(GPT2, "tiny", splits, model, SPLIT, sched, TIE, applied_at, BATCH, 0,
                     system == "gpipe")
    for state, st in zip(states, ref, strict=True):
        for name, p in st.named_parameters():
            assert torch.allclose(state[name], p, rtol=1e-4, atol=1e-6), name
