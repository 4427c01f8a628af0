"""pipedream_impl/runtime/comm.py's settled sends, on two real gloo processes: a send is
held until it is settled or flushed, ``settle`` drops exactly the messages it names (gloo
reports none complete on its own), the messages arrive intact either way, and the switch
that turns settling off is read by one rule."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from pipedream_impl.runtime.comm import SETTLE_ENV, TAGS, Comm, settle_sends
from tests.gloo_ranks import run_ranks

N = 5  # messages each way


def _message(kind: str, i: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7 * len(kind) + i)
    return (torch.randn(4, 3, generator=g),)


def _worker(rank: int, world: int, port: int, out) -> None:  # noqa: ANN001
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    comm = Comm(rank, torch.device("cpu"), timeout_s=60, static_shapes=True)
    got, held = [], []
    if rank == 0:  # sends every F first; each B reply says one more F has arrived
        for i in range(N):
            comm.send(_message("F", i), 1, "F")
        held.append(len(comm._sent[(1, TAGS["F"])]))
        for i in range(N):
            got.append(comm.recv(1, "B"))
            comm.settle(1, "F", i + 1)
            comm.settle(1, "F", i)  # already settled: nothing more goes
            held.append(len(comm._sent[(1, TAGS["F"])]))
    else:
        for i in range(N):
            got.append(comm.recv(0, "F"))
            comm.send(_message("B", i), 0, "B")
        held.append(len(comm._sent[(0, TAGS["B"])]))
    comm.flush()
    held.append(sum(len(q) for q in comm._sent.values()))
    dist.destroy_process_group()
    out.put((rank, [[t.tolist() for t in m] for m in got], held))


@pytest.mark.multiprocess
def test_settle_drops_exactly_the_named_sends_and_flush_the_rest() -> None:
    results = {rank: (got, held) for rank, got, held in run_ranks(_worker, 2)}
    got0, held0 = results[0]
    got1, held1 = results[1]
    assert got1 == [[t.tolist() for t in _message("F", i)] for i in range(N)]
    assert got0 == [[t.tolist() for t in _message("B", i)] for i in range(N)]
    assert held0 == [N, *range(N - 1, -1, -1), 0]
    assert held1 == [N, 0]  # never settled: held until the flush


def test_the_switch_refuses_other_values(monkeypatch) -> None:
    monkeypatch.delenv(SETTLE_ENV, raising=False)
    assert settle_sends()
    monkeypatch.setenv(SETTLE_ENV, "0")
    assert not settle_sends()
    monkeypatch.setenv(SETTLE_ENV, "yes")
    with pytest.raises(ValueError, match="PIPEBENCH_SETTLE_SENDS"):
        settle_sends()
