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


class _Work:
    """A send handle that reports itself complete or not (NCCL's do, gloo's never)."""

    def __init__(self, done: bool) -> None:
        self.done, self.waited = done, False

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout) -> bool:  # noqa: ANN001
        self.waited = True
        return True


def test_sends_reported_complete_are_dropped_in_order_and_settle_counts_them(
        monkeypatch) -> None:
    """The prune drops completed messages from the front of each link only, so settle's
    count still names the link's first messages: after the first 70 messages (64 of them
    reported complete) are pruned, settling 66 waits for exactly messages 64 and 65."""
    import pipedream_impl.runtime.comm as comm_mod

    works: list[_Work] = []

    def isend(t, dst, tag):  # noqa: ANN001, ANN202
        works.append(_Work(done=len(works) < 64))
        return works[-1]

    monkeypatch.setattr(comm_mod.dist, "isend", isend)
    comm = Comm(0, torch.device("cpu"), timeout_s=5, static_shapes=True)
    comm._sent_shapes[(1, TAGS["F"])] = [(torch.float32, (2,))]  # no header message
    for _ in range(64):
        comm.send((torch.zeros(2),), 1, "F")
    assert len(comm._sent[(1, TAGS["F"])]) == 0  # the 64th send pruned them all
    for _ in range(6):
        comm.send((torch.zeros(2),), 1, "F")
    comm.settle(1, "F", 66)
    assert [w.waited for w in works[62:70]] == [False] * 2 + [True] * 2 + [False] * 4
    assert len(comm._sent[(1, TAGS["F"])]) == 4
    comm.flush()
    assert all(w.waited for w in works[66:])
