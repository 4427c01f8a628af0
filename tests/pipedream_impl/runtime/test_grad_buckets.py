"""pipedream_impl/runtime/grad_buckets.py: the bucket plan as a pure function; on real gloo
processes, every bucket's all-reduce started during the backward (flat and across faked
hosts) and the result equal to the blocking ``Comm.allreduce_mean``'s to the bit; a
replicated pipeline's weights identical with and without the overlap; a replica killed
with buckets in flight ending the job."""

from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist

from harness.config import RunConfig
from harness.experiments.pipeline_trainer import PipelineTrainer
from harness.reporting.progress import quiet
from pipedream_impl.runtime.comm import Comm
from pipedream_impl.runtime.faults import Fault
from pipedream_impl.runtime.grad_buckets import (
    BUCKET_MB_ENV,
    GradBuckets,
    last_backwards,
    plan_buckets,
)
from pipedream_impl.runtime.hosts import FAKE_HOSTS_ENV
from pipedream_impl.runtime.launcher import PipelineFailure
from pipedream_impl.schedule import Layout, one_f_one_b
from tests.gloo_ranks import run_ranks
from workloads.registry import get


def test_buckets_run_in_reverse_parameter_order_up_to_the_cap() -> None:
    assert plan_buckets([4, 4, 4, 4], 8) == [[3, 2], [1, 0]]
    assert plan_buckets([4, 100, 4, 4], 8) == [[3, 2], [1], [0]]
    assert plan_buckets([4, 4, 4], 1e9) == [[2, 1, 0]]
    assert plan_buckets([4, 4, 4], 0) == [[2], [1], [0]]


def test_the_overlapped_backward_is_the_last_one_before_each_all_reduce() -> None:
    """1F1B-RR 2-1: each replica of stage 0 all-reduces after every backward (a round of 2
    minibatches is one per replica); the unreplicated stage has no A, so no overlap."""
    sched = one_f_one_b(Layout((2, 1)), 8, "stash")
    for rank in (0, 1):
        acts = sched.actions[rank]
        picked = last_backwards(acts)
        assert picked and all(acts[p].kind == "B" for p in picked)
        # each picked B is followed by A with no other backward between
        assert all(next(a.kind for a in acts[p + 1:] if a.kind in ("A", "B")) == "A"
                   for p in picked)
        assert len(picked) == sum(a.kind == "A" for a in acts)
    assert last_backwards(sched.actions[2]) == set()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _worker(rank: int, world: int, port: int, hosts: str, out) -> None:  # noqa: ANN001
    import os

    os.environ[FAKE_HOSTS_ENV] = hosts
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        ranks = tuple(range(world))
        comm = Comm(rank, torch.device("cpu"), 60.0)
        comm.allreduce_groups(ranks)
        model = _model()
        params = list(model.parameters())
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(rank))
        model(x).square().sum().backward()  # an earlier microbatch of the round
        buckets = GradBuckets(comm, ranks, params, cap_mb=300 / 2**20)  # ~75 floats each
        started = []
        buckets.arm(params, lambda i: params[i].grad.clone())
        # the last layer's weight is final before the first layer's: hook order shows it
        params[0].register_hook(lambda g: started.append(len(buckets.waits)))
        model(2 * x).square().sum().backward()  # the round's last backward
        buckets.disarm()
        grads = [p.grad.clone() for p in params]
        blocking = [g.clone() for g in grads]
        buckets.finish(grads)
        after_overlap = dict(comm.stats.allreduce_levels)
        comm.allreduce_mean(blocking, ranks)
        levels = {lv: b - after_overlap[lv] for lv, b in comm.stats.allreduce_levels.items()}
        out.put((rank, len(buckets.buckets), buckets.started_early, started,
                 all(torch.equal(a, b) for a, b in zip(grads, blocking, strict=True)),
                 after_overlap, levels))
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.parametrize("hosts", ["a,a", "a,a,b"])
def test_buckets_start_during_the_backward_and_equal_the_blocking_average(hosts: str) -> None:
    """Two ranks on one host (one all-reduce per bucket), three on two faked hosts (reduce,
    leaders' all-reduce, broadcast, on the chain thread): every bucket starts before the
    backward ends, buckets of the last layers before the first layer's gradient exists,
    and the mean and the bytes per level equal the blocking path's."""
    got = run_ranks(_worker, len(hosts.split(",")), hosts)
    for _rank, n_buckets, early, started, equal, overlap_levels, blocking_levels in got:
        assert n_buckets >= 3 and early == n_buckets
        assert started and started[0] >= 1  # started while the backward still ran
        assert equal
        assert overlap_levels == blocking_levels  # the same bytes per level


@pytest.mark.multiprocess
@pytest.mark.parametrize("weights", ["stash", "none"])
def test_replicated_pipeline_weights_equal_the_blocking_all_reduces(monkeypatch,
                                                                     weights: str) -> None:
    """2-1 on 3 workers (snapshots under stashing, the module's own gradients under naive
    pipelining): small buckets overlapped with the backward give the weights and bytes
    that one blocking all-reduce at A gives, to the bit (two replicas: exact sums)."""
    wl = get("vgg16")
    splits = wl.default_data("tiny", 0)
    replicas, bounds = (2, 1), ((0, 20), (20, 40))
    runs = []
    for mb in ("0", "0.05"):  # 0: the blocking all-reduce at A
        monkeypatch.setenv(BUCKET_MB_ENV, mb)
        cfg = RunConfig.from_flags(system="pipedream", workload="vgg16", scale="tiny",
                                   workers=3, threads=1, max_steps_per_epoch=6, epochs=1,
                                   timeout_s=60, weights=weights)
        t = PipelineTrainer(cfg, wl, splits, replicas, bounds, torch.device("cpu"), quiet())
        try:
            runs.append(t.launcher.epoch(0))
        finally:
            t.close()
    blocking, overlapped = runs
    for a, b in zip(blocking, overlapped, strict=True):
        assert a.rank == b.rank and a.allreduce_bytes == b.allreduce_bytes
        for k in a.state:
            assert torch.equal(a.state[k], b.state[k]), (a.rank, k)
    assert blocking[0].allreduce_bytes > 0


@pytest.mark.multiprocess
def test_a_replica_killed_with_buckets_in_flight_ends_the_job() -> None:
    """2-1: rank 1 dies at its first A, after its last backward started the buckets that
    rank 0 now waits for; the job ends naming rank 1, within the bound, no worker left."""
    wl = get("vgg16")
    splits = wl.default_data("tiny", 0)
    cfg = RunConfig.from_flags(system="pipedream", workload="vgg16", scale="tiny", workers=3,
                               threads=1, max_steps_per_epoch=6, epochs=1, timeout_s=20,
                               fault=Fault("kill", 1, "A", 1))
    t0 = time.monotonic()
    t = PipelineTrainer(cfg, wl, splits, (2, 1), ((0, 20), (20, 40)), torch.device("cpu"),
                        quiet())
    try:
        with pytest.raises(PipelineFailure, match="rank 1"):
            t.launcher.epoch(0)
    finally:
        t.close()
    assert time.monotonic() - t0 < 60
    assert all(not p.is_alive() for p in t.launcher.procs)
