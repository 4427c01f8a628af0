"""pipedream_impl/runtime/comm.py's receives posted ahead, on two real gloo processes: the
messages a receiver takes are the ones sent, in order, whether their receives were posted
ahead or not (``PIPEBENCH_RECV_AHEAD``), and the switch decides how many are kept posted
ahead; a value that is not a count is refused. A message received when due posts every
tensor's receive before waiting for any."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from pipedream_impl.runtime.comm import RECV_AHEAD_ENV, Comm, recv_ahead
from tests.gloo_ranks import run_ranks

N = 6  # messages each way


def _message(kind: str, i: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(100 * len(kind) + i)
    return torch.randn(3, 5, generator=g), torch.randint(0, 9, (4,), generator=g)


def _worker(rank: int, world: int, port: int, ahead: str, out) -> None:  # noqa: ANN001
    import os
    os.environ[RECV_AHEAD_ENV] = ahead
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    comm = Comm(rank, torch.device("cpu"), timeout_s=60, static_shapes=True)
    got, posted = [], 0
    if rank == 0:  # sends every F message first, then takes every B reply
        for i in range(N):
            comm.send(_message("F", i), 1, "F")
        for i in range(N):
            got.append(comm.recv(1, "B", prefetch=N - 1 - i))
            posted += len(comm._posted[(1, 2)])
    else:  # takes each F message, answers with a B message
        for i in range(N):
            got.append(comm.recv(0, "F", prefetch=N - 1 - i))
            posted += len(comm._posted[(0, 1)])
            comm.send(_message("B", i), 0, "B")
    comm.flush()
    dist.destroy_process_group()
    out.put((rank, [[t.tolist() for t in m] for m in got], posted))


@pytest.mark.multiprocess
@pytest.mark.parametrize("ahead", ["1", "0", "3"])
def test_messages_arrive_in_order_with_and_without_receives_posted_ahead(ahead: str) -> None:
    results = {rank: (got, posted) for rank, got, posted in run_ranks(_worker, 2, ahead)}
    for rank, kind in ((1, "F"), (0, "B")):
        got, posted = results[rank]
        assert got == [[t.tolist() for t in _message(kind, i)] for i in range(N)]
        # after the message i, the receives of the next min(N - 1 - i, ahead) are posted
        # (from the first on: its header gives the shapes)
        assert posted == sum(min(k, int(ahead)) for k in range(N))


def test_the_switch_refuses_other_values(monkeypatch) -> None:
    monkeypatch.delenv(RECV_AHEAD_ENV, raising=False)
    assert recv_ahead() == 1
    for value in ("0", "4"):
        monkeypatch.setenv(RECV_AHEAD_ENV, value)
        assert recv_ahead() == int(value)
    for value in ("off", "-1", "1.5"):
        monkeypatch.setenv(RECV_AHEAD_ENV, value)
        with pytest.raises(ValueError, match="PIPEBENCH_RECV_AHEAD"):
            recv_ahead()


def test_a_message_posts_every_receive_before_waiting_for_any(monkeypatch) -> None:
    """A message's tensors, received when due: every receive is posted before the first
    wait (each posted alone and waited for would cost a round trip with the sender each,
    GNMT's three-tensor messages three)."""
    import pipedream_impl.runtime.comm as comm_mod

    log: list[str] = []

    class Work:
        def __init__(self, i: int) -> None:
            self.i = i

        def wait(self, timeout=None) -> bool:  # noqa: ANN001
            log.append(f"wait {self.i}")
            return True

    def irecv(t, src, tag):  # noqa: ANN001, ANN202
        log.append(f"post {len(log)}")
        return Work(len(log) - 1)

    monkeypatch.setattr(comm_mod.dist, "irecv", irecv)
    monkeypatch.setenv(RECV_AHEAD_ENV, "0")
    comm = Comm(0, torch.device("cpu"), timeout_s=5, static_shapes=True)
    comm._recv_shapes[(1, 1)] = [(torch.float32, (2, 3)), (torch.int64, (4,)),
                                 (torch.int64, (4,))]
    got = comm.recv(1, "F")
    assert [tuple(t.shape) for t in got] == [(2, 3), (4,), (4,)]
    assert [e.split()[0] for e in log] == ["post"] * 3 + ["wait"] * 3
