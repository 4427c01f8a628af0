"""Which ranks share a host, and the hierarchical all-reduce's levels over them.

Why apart from ``comm``: a replicated stage's gradients are averaged by the all-reduce the
planner and the simulator model (``harness.sim.costs.Topology.ring_levels``): hierarchical,
one level per machine boundary. Which rank is on which host, and what each level sends,
is one fact the communication layer (``comm``) acts on and the tests check alone.

``Hierarchy`` groups a stage's replica ranks by host: inside each host the ranks reduce to
their leader (the host's first rank), the leaders all-reduce among themselves, and each
leader broadcasts the sum back inside its host; on one host that is the flat all-reduce
over the replica group. Bytes are counted per level as the model charges them
(``core.collectives``): inside a host ``2 (k-1)/k`` per byte for the host's ``k`` ranks
(the reduce and the broadcast), among hosts ``2 (h-1)/h`` per byte on each of the ``h``
leaders. Hosts are each rank's host name; ``PIPEBENCH_FAKE_HOSTS`` (a test hook: one
comma-separated name per global rank) overrides them, to fake several hosts on one
machine.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from core.collectives import ring_allreduce_bytes

__all__ = ["AMONG_HOSTS", "FAKE_HOSTS_ENV", "HOST", "Hierarchy", "host_name"]

FAKE_HOSTS_ENV = "PIPEBENCH_FAKE_HOSTS"  # test hook: "a,a,b,b" = host of each global rank
HOST, AMONG_HOSTS = 0, 1  # the all-reduce's levels: inside a host, between hosts


def host_name(rank: int) -> str:
    """This rank's host: its entry of ``PIPEBENCH_FAKE_HOSTS`` if set, else the hostname."""
    fake = os.environ.get(FAKE_HOSTS_ENV, "")
    if fake:
        names = fake.split(",")
        if rank >= len(names):
            raise ValueError(f"{FAKE_HOSTS_ENV}={fake!r} names {len(names)} hosts, but this "
                             f"is rank {rank}: give one host per rank")
        return names[rank]
    return socket.gethostname()


@dataclass(frozen=True)
class Hierarchy:
    """A replica group's all-reduce, level by level: ``local`` holds the ranks of each host
    (hosts in order of their first rank, ranks in the group's order), ``leaders`` the first
    rank of each host."""
    local: tuple[tuple[int, ...], ...]
    leaders: tuple[int, ...]

    @classmethod
    def of(cls, ranks: Sequence[int], hosts: Sequence[str]) -> Hierarchy:
        """Group ``ranks`` by ``hosts[rank]`` (hosts: one name per global rank)."""
        by_host: dict[str, list[int]] = {}
        for r in ranks:
            by_host.setdefault(hosts[r], []).append(r)
        local = tuple(tuple(g) for g in by_host.values())
        return cls(local, tuple(g[0] for g in local))

    def groups(self) -> list[tuple[int, ...]]:
        """The process groups it needs, in creation order: each host's ranks (where more
        than one), then the leaders (where more than one host). One host: the flat group."""
        out = [g for g in self.local if len(g) > 1]
        return out + ([self.leaders] if len(self.leaders) > 1 else [])

    def ring_levels(self) -> list[tuple[int, int]]:
        """(level, k) of each ring, as ``Topology.ring_levels`` gives them: inside a host
        (k: the most ranks on one host), then among the hosts (k: the hosts)."""
        out = []
        if max(len(g) for g in self.local) > 1:
            out.append((HOST, max(len(g) for g in self.local)))
        if len(self.leaders) > 1:
            out.append((AMONG_HOSTS, len(self.leaders)))
        return out

    def host_of(self, rank: int) -> tuple[int, ...]:
        return next(g for g in self.local if rank in g)

    def bytes_sent(self, rank: int, nbytes: int) -> dict[int, int]:
        """Bytes ``rank`` sends at each level to all-reduce ``nbytes``, as the model counts
        them: a ring inside its host, and (leaders) a ring among the hosts."""
        out = {HOST: int(ring_allreduce_bytes(nbytes, len(self.host_of(rank))))}
        if rank in self.leaders:
            out[AMONG_HOSTS] = int(ring_allreduce_bytes(nbytes, len(self.leaders)))
        return {lv: b for lv, b in out.items() if b}
