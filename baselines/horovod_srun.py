"""``--system horovod`` across a Slurm allocation: Horovod's own gloo launch, with srun as
its remote shell.

Why: on one machine ``horovodrun`` starts the ranks (``baselines.horovod``); across nodes
it would reach them over ssh, which clusters run through Slurm seldom allow. What
``horovodrun --gloo`` does is Horovod's own machinery (``horovod.runner.gloo_run``): an
HTTP rendezvous server in the launching process, initialised with the host assignment of
every slot, and each rank started with the ``HOROVOD_*`` variables of its slot (rank,
size, local and cross rank, host name, the rendezvous address). Here the launcher runs
that same server and assignment (``RendezvousServer``, ``get_host_assignments``) and
starts the ranks with one ``srun`` step whose tasks take their slot from Slurm's
(``SLURM_PROCID`` / ``SLURM_LOCALID`` / ``SLURM_NODEID``: block distribution, as the
assignment fills hosts in order). The ranks then connect back like horovodrun's
(``remote.connect_back`` through ``baselines.horovod.main``).

``GLOO_SOCKET_IFNAME``, when set, is also Horovod's gloo interface (``HOROVOD_GLOO_IFACE``);
otherwise Horovod binds to the address of each node's host name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousServer

from baselines.horovod import HOROVOD_ENV, REPO
from pipedream_impl.runtime.contract import WorkerSpec
from pipedream_impl.runtime.srun import SrunLauncher

__all__ = ["HorovodSrunLauncher"]


class HorovodSrunLauncher(SrunLauncher):
    name = "srun (horovod)"

    def _start(self, specs: list[WorkerSpec]) -> None:
        self._rendezvous = RendezvousServer()  # initialised once the nodes are known
        self._rendezvous_port = self._rendezvous.start()
        super()._start(specs)

    def _command(self, specs: list[WorkerSpec], spec_file: Path, address: tuple[str, int],
                 authkey: bytes) -> tuple[list[str], dict[str, str]]:
        hosts = ",".join(f"{n}:{self.per_node}" for n in self.nodes)
        self._rendezvous.init(get_host_assignments(parse_hosts(hosts), len(specs)))
        task = ('export HOROVOD_RANK=$SLURM_PROCID HOROVOD_LOCAL_RANK=$SLURM_LOCALID '
                'HOROVOD_CROSS_RANK=$SLURM_NODEID HOROVOD_HOSTNAME=$SLURMD_NODENAME; '
                f'exec "{sys.executable}" -m baselines.horovod "{spec_file}" {address[0]} '
                f"{address[1]} {authkey.hex()}")
        cmd = ["srun", f"--nodes={len(self.nodes)}", f"--ntasks={len(specs)}",
               f"--ntasks-per-node={self.per_node}", "--distribution=block",
               "--kill-on-bad-exit=1", "--job-name=pipebench-horovod", "bash", "-c", task]
        env = {**os.environ, **HOROVOD_ENV,
               "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.advertise,
               "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self._rendezvous_port),
               "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
               "HOROVOD_SIZE": str(len(specs)), "HOROVOD_LOCAL_SIZE": str(self.per_node),
               "HOROVOD_CROSS_SIZE": str(len(self.nodes)),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        if os.environ.get("GLOO_SOCKET_IFNAME"):
            env["HOROVOD_GLOO_IFACE"] = os.environ["GLOO_SOCKET_IFNAME"]
        return cmd, env

    def close(self, kill: bool = False) -> None:
        super().close(kill)
        if getattr(self, "_rendezvous", None) is not None:
            self._rendezvous.stop()
            self._rendezvous = None
