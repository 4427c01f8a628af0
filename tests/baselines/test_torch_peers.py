"""baselines/torch_peers.py: torch's interleaved, zero-bubble and V schedules on our stage
boundaries, and token ids crossing the split, against single-process training."""

from __future__ import annotations

import pytest
import torch

from baselines.torch_peers import boundary_examples, check_engine_microbatches, stage_ranks
from harness.config import RunConfig
from harness.experiments.pipeline_trainer import PipelineTrainer
from harness.reporting.progress import quiet
from tests.pipeline_reference import (
    assert_same,
    microbatch_mean_reference,
    single_process_reference,
)
from workloads.registry import get

STEPS = 4


@pytest.mark.parametrize("workers, stages, v_shape", [(2, 4, False), (3, 6, False),
                                                      (4, 12, False), (2, 4, True),
                                                      (4, 8, True)])
def test_stage_placement_is_torchs_looped_or_v_shape(workers: int, stages: int,
                                                     v_shape: bool) -> None:
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    torch_map = generate_stage_to_rank_mapping(workers, stages, "v" if v_shape else "loop")
    assert stage_ranks(workers, stages, v_shape) == tuple(torch_map[s] for s in range(stages))
    held = [[s for s, r in enumerate(stage_ranks(workers, stages, v_shape)) if r == rank]
            for rank in range(workers)]
    if v_shape:  # rank r holds r and 2W-1-r
        assert held == [[r, 2 * workers - 1 - r] for r in range(workers)]
    else:  # rank r holds r, r + W, r + 2W, ...
        assert held == [list(range(r, stages, workers)) for r in range(workers)]


def test_microbatch_counts_the_engines_refuse_are_said_up_front() -> None:
    assert "at least as many microbatches as stages (4)" in \
        check_engine_microbatches("dualpipev", 2, 4, 2)
    assert check_engine_microbatches("dualpipev", 2, 4, 4) is None
    assert "multiple of max(1, microbatches // workers) = 3" in \
        check_engine_microbatches("interleaved-1f1b", 2, 4, 7)  # 7 // 2 = 3 rounds
    assert check_engine_microbatches("zb", 2, 4, 8) is None
    assert check_engine_microbatches("flush", 2, 2, 1) is None


def test_boundary_metadata_keeps_token_ids_int64_up_to_the_largest_vocabulary() -> None:
    """torch gets each boundary's tensors up front (static metadata): ids stay int64 (no
    float round trip: exact for any id, 8 bytes each, as our runtime sends them), only
    floating tensors ask for gradients, and the values are the model's own."""
    wl = get("gnmt8")
    data = wl.default_data("tiny", 0).train
    model = wl.build("tiny", data.meta)
    n = len(model.layers)
    bounds = ((0, 3), (3, n - 1), (n - 1, n))
    inputs = wl.make_batch(data, torch.arange(4)).inputs
    ex = boundary_examples(model, bounds, inputs, torch.device("cpu"))
    assert len(ex) == 4 and model.training  # train mode restored
    with torch.no_grad():
        model.eval()
        mid = model.stage(0, 3)(inputs)
    assert [t.dtype for t in ex[1]] == [t.dtype for t in mid]
    ids = [i for i, t in enumerate(mid) if t.dtype == torch.int64]
    assert ids and all(torch.equal(ex[1][i], mid[i]) for i in ids)
    assert all(ex[1][i].requires_grad == ex[1][i].is_floating_point() for i in range(len(mid)))
    assert not any(t.requires_grad for t in ex[0])  # the data itself needs no gradient
    # GNMT's full vocabulary is 32,320 BPE tokens (S2VT's about 12,000); as int64 any id
    # crosses exactly, even past float32's 2^24 limit for whole numbers
    big = torch.tensor([32319, 2**24 + 1, 2**53 + 1])
    assert torch.equal(boundary_examples(model.stage(0, 0), ((0, 0),), (big,),
                                         torch.device("cpu"))[1][0], big)


def _run(system: str, workload: str, bounds, splits, micro: int = 4) -> PipelineTrainer:
    cfg = RunConfig.from_flags(system=system, workload=workload, workers=2, threads=1,
                    max_steps_per_epoch=STEPS, epochs=1, timeout_s=60, microbatches=micro)
    pipe = PipelineTrainer(cfg, get(workload), splits, (1, 1), bounds, torch.device("cpu"),
                           quiet())
    try:
        pipe.stats = pipe.train_epoch(0)
    finally:
        pipe.close()
    return pipe


@pytest.mark.multiprocess
@pytest.mark.parametrize("system, v_shape", [("torch-interleaved-1f1b", False),
                                             ("torch-zb", False), ("torch-zbv", True),
                                             ("torch-dualpipev", True)])
def test_multi_stage_schedule_equals_single_process_and_counts_boundary_bytes(
        system: str, v_shape: bool) -> None:
    """Two workers, four stages: after STEPS minibatches of 4 microbatches the weights
    equal single-process training; every boundary between stages on different ranks
    carries its activations one way and their gradients the other."""
    wl = get("vgg16")
    splits = wl.default_data("tiny", 0)
    bounds = ((0, 6), (6, 12), (12, 26), (26, 40))
    pipe = _run(system, "vgg16", bounds, splits)
    ref_model, ref_stats = single_process_reference(wl, splits, STEPS)
    assert_same(pipe.model, ref_model)
    assert pipe.stats.steps == STEPS
    assert pipe.stats.train_loss == pytest.approx(ref_stats.train_loss, rel=1e-4)
    model = wl.build("tiny", splits.train.meta)
    x = wl.make_batch(splits.train, torch.arange(1)).inputs
    per_sample = []  # bytes per sample crossing boundary s -> s+1
    for a, b in bounds[:-1]:
        x = model.stage(a, b)(x)
        per_sample.append(x[0].numel() * 4)
    rank = [0, 1, 1, 0] if v_shape else [0, 1, 0, 1]  # written out, not computed
    want: dict = {}
    for s, size in enumerate(per_sample):
        if rank[s] != rank[s + 1]:  # activations forward, gradients back
            for link in ((rank[s], rank[s + 1]), (rank[s + 1], rank[s])):
                want[link] = want.get(link, 0) + size
    samples = STEPS * wl.spec("tiny").batch_size
    assert pipe.metrics.links == {k: v * samples for k, v in want.items()}
    # every compute action torch ran is timed under its kind (the zero-bubble schedules
    # split the backward into I and W; DualPipeV also runs whole backwards overlapped with
    # forwards), the optimizer step as U, and each rank waited at least once per step
    kinds = {"torch-interleaved-1f1b": {"F", "B", "U"}, "torch-zb": {"F", "I", "W", "U"},
             "torch-zbv": {"F", "I", "W", "U"}, "torch-dualpipev": {"F", "B", "I", "W", "U"}}
    for r in (0, 1):
        assert set(pipe.metrics.action_s[r]) == kinds[system] | {"wait"}
        assert pipe.metrics.idle[r] == pytest.approx(pipe.metrics.action_s[r]["wait"])
        assert pipe.metrics.idle[r] > 0


@pytest.mark.multiprocess
@pytest.mark.parametrize("workload, system", [("gnmt8", "torch-1f1b"), ("s2vt", "torch-1f1b"),
                                              ("gnmt8", "torch-zbv"),
                                              ("gnmt8", "deepspeed-pipe")])
def test_token_ids_cross_the_split_and_training_equals_one_process(workload: str,
                                                                   system: str) -> None:
    """The split sends int64 token ids (GNMT's source ids, S2VT's captions) with the
    activations: each peer trains exactly as one process on the same microbatches."""
    wl = get(workload)
    splits = wl.default_data("tiny", 0)
    model = wl.build("tiny", splits.train.meta)
    n = len(model.layers)
    bounds = ((0, n // 2), (n // 2, n))
    x = model.stage(0, n // 2)(wl.make_batch(splits.train, torch.arange(2)).inputs)
    assert torch.int64 in {t.dtype for t in x}  # ids do cross this split
    if system == "torch-zbv":  # four stages, the ids crossing at stage 0 -> 1 (rank 0 -> 1)
        bounds = ((0, n // 2), (n // 2, n - 2), (n - 2, n - 1), (n - 1, n))
    pipe = _run(system, workload, bounds, splits)
    assert_same(pipe.model, microbatch_mean_reference(get(workload), splits, STEPS, 4)[0])
    assert pipe.stats.steps == STEPS
    if system == "torch-zbv":
        return  # its bytes: the test above
    floats = sum(t.numel() * 4 for t in x if t.is_floating_point()) // 2  # per sample
    ids = sum(t.numel() * 8 for t in x if not t.is_floating_point()) // 2
    samples = STEPS * wl.spec("tiny").batch_size
    # ids go forward as int64 (8 bytes each, as our runtime sends them); only the floating
    # activations' gradients come back
    assert pipe.metrics.links == {(0, 1): samples * (floats + ids), (1, 0): samples * floats}


def test_too_few_layers_for_two_stages_per_worker_is_refused_in_one_line(tmp_path) -> None:
    from core.errors import UserInputError

    # S2VT tiny has 4 layers: 3 workers x 2 stages = 6 stages cannot be cut from it
    from harness.experiments.layout import check_run

    with pytest.raises(UserInputError, match="only 4 layers; use at most 2 workers"):
        check_run(RunConfig.from_flags(system="torch-zbv", workload="s2vt", workers=3))
    check_run(RunConfig.from_flags(system="torch-zbv", workload="s2vt", workers=2))  # fine
    # a plan for them lists every stage: workers x 2 unreplicated ones, covering the model
    from pipedream_impl.planner.plan import Plan, Stage

    def plan(bounds: list[tuple[int, int]]) -> str:
        path = tmp_path / f"plan{len(bounds)}.json"
        path.write_text(Plan(tuple(Stage(b, 1, (i,), 0.0) for i, b in enumerate(bounds)),
                             len(bounds), {}).to_json())
        return str(path)

    four = plan([(0, 10), (10, 20), (20, 30), (30, 40)])
    check_run(RunConfig.from_flags(system="torch-interleaved-1f1b", workload="vgg16",
                                   workers=2, plan=four))  # fine
    with pytest.raises(UserInputError, match="its plan lists 4 stages of one replica each"):
        check_run(RunConfig.from_flags(system="torch-interleaved-1f1b", workload="vgg16",
                                       workers=2, plan=plan([(0, 20), (20, 40)])))
