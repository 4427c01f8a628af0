"""When a sent message is known to have arrived, read from the schedule alone.

Why: a pipeline worker sends asynchronously and must keep each sent tensor until its send
completes. gloo reports a send complete only once it is waited for, and waiting for a send
whose receive is not yet posted can deadlock a valid schedule, so the runtime used to hold
every sent tensor until the epoch's end: memory that grew with the epoch, each new
activation or gradient landing in fresh pages that the process faulted in one by one (what
holding them cost here, in memory, faults and throughput: ``results/settle-sends-ab-*.md``).

The schedule says when such a wait cannot block. If rank ``d`` had received our first ``n``
messages of a kind before it sent a message that we have now received, those ``n`` messages
have arrived (messages of one kind between two ranks arrive in the order sent), so their
sends need nothing more from anyone: waiting for them returns at once and their tensors can
go. In a pipeline that is every forward send once the gradient of the same unit comes back,
and every gradient sent back once the previous stage's next forward that followed it
arrives. Only messages back from the same peer are used; causality through third ranks
could settle a few sends sooner, but every pipeline schedule sends back along its links, and
whatever is never settled this way is still waited for at the epoch's end.

``receives_followed`` is the other thing the runtime reads about its messages from the
list: how many receives of the same kind from the same peer follow each receive, so that
theirs can be posted early (``Comm.recv(prefetch=)``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from core.errors import ScheduleError
from pipedream_impl.schedule.actions import Action

__all__ = ["RECEIVES", "SENDS", "delivered", "receives_followed"]

SENDS = {"SF": "F", "SB": "B", "ST": "T"}  # a send action -> the kind of message it sends
RECEIVES = {"RF": "F", "RB": "B", "RT": "T"}  # a receive action -> the kind it receives


def delivered(actions: Sequence[Sequence[Action]], rank: int) \
        -> dict[int, tuple[tuple[int, str, int], ...]]:
    """For ``rank``'s action list in ``actions`` (every rank's, one epoch): at each position
    whose receive tells something new, the ``(peer, kind, count)`` triples such that, once
    that receive is done, the first ``count`` messages of ``kind`` that ``rank`` sent to
    ``peer`` this epoch are known to have been received there."""
    mine = actions[rank]
    peers = {a.peer for a in mine if a.kind in RECEIVES}
    # (peer, kind) -> for each message of that kind the peer sends to rank, in order: how
    # many of rank's messages of each kind the peer had received before sending it
    seen_by_then: dict[tuple[int, str], list[dict[str, int]]] = {}
    for d in peers:
        got: Counter[str] = Counter()
        for a in actions[d]:
            if a.peer != rank:
                continue
            if a.kind in RECEIVES:
                got[RECEIVES[a.kind]] += 1
            elif a.kind in SENDS:
                seen_by_then.setdefault((d, SENDS[a.kind]), []).append(dict(got))
    out: dict[int, tuple[tuple[int, str, int], ...]] = {}
    received: Counter[tuple[int, str]] = Counter()  # messages rank received per (peer, kind)
    known: Counter[tuple[int, str]] = Counter()  # rank's messages known arrived, per (peer, kind)
    for pos, a in enumerate(mine):
        if a.kind not in RECEIVES:
            continue
        key = (a.peer, RECEIVES[a.kind])
        sent = seen_by_then.get(key, [])
        if received[key] >= len(sent):
            raise ScheduleError(f"rank {rank}: {a} at position {pos} receives message "
                                f"{received[key] + 1} of kind {key[1]} from rank {a.peer}, "
                                f"which sends it only {len(sent)}")
        by_then = sent[received[key]]
        received[key] += 1
        new = tuple((a.peer, kind, n) for kind, n in sorted(by_then.items())
                    if n > known[(a.peer, kind)])
        for peer, kind, n in new:
            known[(peer, kind)] = n
        if new:
            out[pos] = new
    return out


def receives_followed(acts: Sequence[Action]) -> dict[int, int]:
    """For each forward and gradient receive in ``acts`` (one rank's list), how many
    receives of the same kind from the same peer follow it later in the epoch: the runtime
    may post theirs early (``Comm.recv(prefetch=)``)."""
    out: dict[int, int] = {}
    seen: Counter = Counter()
    for pos in range(len(acts) - 1, -1, -1):
        if acts[pos].kind in ("RF", "RB"):
            out[pos] = seen[(acts[pos].kind, acts[pos].peer)]
            seen[(acts[pos].kind, acts[pos].peer)] += 1
    return out
