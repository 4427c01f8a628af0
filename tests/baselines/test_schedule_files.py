"""One schedule file run on both runtimes: a CSV in torch.distributed.pipelining's format
(here ZB-H1's step, with split backwards) trains on our runtime (--system custom) and on
torch's (--system torch-custom, which lowers the file itself), 2 gloo processes each; both
equal single-process training on whole minibatches, hence each other."""

from __future__ import annotations

import pytest

from pipedream_impl.schedule import Layout
from pipedream_impl.schedule import registry as schedules
from pipedream_impl.schedule.torch_csv import order_of, write_csv
from tests.pipeline_reference import close, single_process_reference, train_two_workers
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


@pytest.mark.multiprocess
def test_one_csv_trains_alike_on_our_runtime_and_torchs(splits, schedule_file) -> None:
    ref = single_process_reference(WL, splits, STEPS)[0]
    ours = train_two_workers(WL, splits, "custom", STEPS, schedule_file=schedule_file)
    theirs = train_two_workers(WL, splits, "torch-custom", STEPS, schedule_file=schedule_file)
    assert close(ours, ref) and close(theirs, ref) and close(ours, theirs)
