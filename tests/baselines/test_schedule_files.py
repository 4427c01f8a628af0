"""One schedule file run on both runtimes: a CSV in torch.distributed.pipelining's format
(here ZB-H1's step, with split backwards) trains on our runtime (--system custom) and on
torch's (--system torch-custom, which lowers the file itself), 2 gloo processes each; both
equal single-process training on whole minibatches, hence each other."""

from __future__ import annotations

import pytest
import torch

from harness.config import RunConfig
from harness.experiments.pipeline_trainer import PipelineTrainer
from harness.reporting.progress import quiet
from pipedream_impl.schedule import Layout
from pipedream_impl.schedule import registry as schedules
from pipedream_impl.schedule.torch_csv import order_of, write_csv
from tests.pipeline_reference import single_process_reference
from workloads.registry import get

WL = get("vgg16")
STEPS, M = 4, 4


@pytest.fixture(scope="module")
def splits():
    return WL.default_data("tiny", 0)


@pytest.fixture(scope="module")
def schedule_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("schedule") / "zb-h1.csv"
    path.write_text(write_csv(order_of(schedules.build("zb-h1", Layout((1, 1)), 1, M))))
    return str(path)


def _train(splits, system: str, schedule_file: str) -> torch.nn.Module:
    cfg = RunConfig(system=system, workload="vgg16", scale="tiny", workers=2, threads=1,
                    max_steps_per_epoch=STEPS, epochs=1, timeout_s=60,
                    schedule_file=schedule_file)
    t = PipelineTrainer(cfg, WL, splits, (1, 1), ((0, 12), (12, 40)), torch.device("cpu"),
                        quiet())
    try:
        assert t.train_epoch(0).steps == STEPS
    finally:
        t.close()
    return t.model


@pytest.mark.multiprocess
def test_one_csv_trains_alike_on_our_runtime_and_torchs(splits, schedule_file) -> None:
    ref = single_process_reference(WL, splits, STEPS)[0]
    ours = _train(splits, "custom", schedule_file)
    theirs = _train(splits, "torch-custom", schedule_file)
    for a, b, r in zip(ours.parameters(), theirs.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, r, rtol=1e-4, atol=1e-5)
        assert torch.allclose(b, r, rtol=1e-4, atol=1e-5)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
