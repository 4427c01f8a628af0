"""``--system horovod``: data parallelism with Horovod, launched with ``horovodrun --gloo``.

Worker side (``HorovodExecutor``, run by ``python -m baselines.horovod`` under horovodrun):
the shared data-parallel loop (``baselines.data_parallel``) with Horovod's recipe:
``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state`` from rank 0, then
``hvd.DistributedOptimizer(op=Average, compression=none, groups=GROUPS)`` with default
tensor fusion and cycle time and autotune off (``HOROVOD_AUTOTUNE=0``). The step is
``synchronize(); clip (where the workload clips); with skip_synchronize(): step()``, so
clipping sees averaged gradients, as in one process, and the wait for the all-reduces is
timed on its own (action ``A``).

``broadcast_optimizer_state`` initialises a fresh optimizer by taking one step with zero
gradients; with Adam that advances the bias-correction step count and with weight decay it
moves the weights. The executor undoes that side effect (restores the weights and the empty
optimizer state, identical on every rank after the broadcasts), so a Horovod run equals
single-process training on the global batch (tested) and the comparison stays fair.

Communication volume: every tensor ``DistributedOptimizer`` hands to Horovod's
``allreduce_async_`` or ``grouped_allreduce_async_`` is counted at 2 (W-1)/W x its bytes
(ring all-reduce), per rank.
Fusion changes how many messages carry them, not how many bytes.

Launcher side (``HorovodLauncher``): the shared launcher (``pipedream_impl.runtime.launcher``) with
workers started by ``horovodrun -np W -H localhost:W --gloo`` instead of
``torch.multiprocessing``; they connect back to the launcher over a local authenticated
socket that carries the same control messages and epoch reports as the spawn queues
(``pipedream_impl.runtime.remote``). Across a Slurm allocation (``--launcher srun``)
``HorovodSrunLauncher`` starts them with srun instead, Horovod's own gloo rendezvous
run by the launcher.
The bootstrap builds Horovod for the CPU (gloo); GPU runs need a Horovod built with
``HOROVOD_GPU_OPERATIONS=NCCL``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import sys
from pathlib import Path

import torch

from baselines.data_parallel import DataParallelExecutor
from pipedream_impl.runtime.contract import WorkerSpec
from pipedream_impl.runtime.launcher import PipelineFailure
from pipedream_impl.runtime.remote import SocketLauncher, connect_back
from pipedream_impl.runtime.srun import SrunLauncher, cpus_per_task

__all__ = ["HOROVOD_ENV", "HorovodExecutor", "HorovodLauncher", "HorovodSrunLauncher"]

REPO = Path(__file__).resolve().parent.parent
HOROVOD_ENV = {"HOROVOD_AUTOTUNE": "0"}  # fusion threshold and cycle time: defaults
# DistributedOptimizer(groups=...): all gradients in one explicit group, one negotiation and
# one fused all-reduce per step (like DDP's buckets on these small models). Measured here
# (results/horovod-tuning.md): 0.72-0.76x DDP with per-tensor all-reduces, 0.79-0.88x with
# one group; cycle times of 5-20 ms and waiting by polling did not help.
GROUPS = 1


class HorovodExecutor(DataParallelExecutor):
    torch_distributed = False  # Horovod runs its own gloo context

    def _wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):  # noqa: ANN202
        import horovod.torch as hvd
        import horovod.torch.optimizer as hvd_optimizer

        hvd.init()
        if hvd.size() != self.world:
            raise RuntimeError(f"horovodrun started {hvd.size()} ranks, the layout has "
                               f"{self.world}")
        real = hvd_optimizer.allreduce_async_

        def counted(tensor, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            self.sent += self.ring_bytes(tensor)
            return real(tensor, *args, **kwargs)

        hvd_optimizer.allreduce_async_ = counted  # what DistributedOptimizer reduces
        real_grouped = hvd_optimizer.grouped_allreduce_async_

        def counted_group(tensors, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            self.sent += sum(self.ring_bytes(t) for t in tensors)
            return real_grouped(tensors, *args, **kwargs)

        hvd_optimizer.grouped_allreduce_async_ = counted_group  # with explicit groups
        pristine_weights = {k: v.clone() for k, v in model.state_dict().items()}
        pristine_state = optimizer.state_dict()
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        # undo the zero-gradient step broadcast_optimizer_state takes on a fresh optimizer,
        # then broadcast rank 0's initial weights (once, after the undo)
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.copy_(pristine_weights[k])
        optimizer.load_state_dict(pristine_state)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer.zero_grad(set_to_none=True)
        dist_opt = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                            compression=hvd.Compression.none, op=hvd.Average,
                                            groups=GROUPS)
        return model, dist_opt

    def _wait_for_gradients(self) -> None:
        self.optimizer.synchronize()  # the hooks started the all-reduces in the backward

    def _optimizer_step(self) -> None:
        with self.optimizer.skip_synchronize():  # synchronized in _wait_for_gradients
            self.optimizer.step()


def horovodrun() -> str:
    exe = Path(sys.executable).parent / "horovodrun"
    found = str(exe) if exe.exists() else shutil.which("horovodrun")
    if found is None:
        raise PipelineFailure("horovodrun not found: Horovod is not installed in this "
                              "environment (make test / make demo install it)")
    return found


class HorovodLauncher(SocketLauncher):
    """Workers started by ``horovodrun -np W -H localhost:W --gloo`` on this machine."""

    name = "horovodrun"
    cwd = str(REPO)

    def _start(self, specs: list[WorkerSpec]) -> None:
        horovodrun()  # missing: said before a listener or a folder is opened
        super()._start(specs)

    def _command(self, specs: list[WorkerSpec], spec_file: Path, address: tuple[str, int],
                 authkey: bytes) -> tuple[list[str], dict[str, str]]:
        n = len(specs)
        cmd = [horovodrun(), "-np", str(n), "-H", f"localhost:{n}", "--gloo",
               sys.executable, "-m", "baselines.horovod", str(spec_file), address[0],
               str(address[1]), authkey.hex()]
        env = {**os.environ, **HOROVOD_ENV,
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        return cmd, env


class HorovodSrunLauncher(SrunLauncher):
    """Horovod's ranks across a Slurm allocation, without horovodrun's ssh: what
    ``horovodrun --gloo`` does (``horovod.runner.gloo_run``: an HTTP rendezvous server in
    the launching process, initialised with every slot's host assignment, each rank
    started with its slot's ``HOROVOD_*`` variables), with one ``srun`` step whose tasks
    take their slot from Slurm's (``SLURM_PROCID``/``LOCALID``/``NODEID``; block
    distribution, as the assignment fills hosts in order). ``GLOO_SOCKET_IFNAME``, when
    set, is also Horovod's gloo interface."""

    name = "srun (horovod)"

    def _start(self, specs: list[WorkerSpec]) -> None:
        from horovod.runner.http.http_server import RendezvousServer

        self._rendezvous = RendezvousServer()  # initialised once the nodes are known
        self._rendezvous_port = self._rendezvous.start()
        super()._start(specs)

    def _command(self, specs: list[WorkerSpec], spec_file: Path, address: tuple[str, int],
                 authkey: bytes) -> tuple[list[str], dict[str, str]]:
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

        hosts = ",".join(f"{n}:{self.per_node}" for n in self.nodes)
        self._rendezvous.init(get_host_assignments(parse_hosts(hosts), len(specs)))
        task = ('export HOROVOD_RANK=$SLURM_PROCID HOROVOD_LOCAL_RANK=$SLURM_LOCALID '
                'HOROVOD_CROSS_RANK=$SLURM_NODEID HOROVOD_HOSTNAME=$SLURMD_NODENAME; '
                f'exec "{sys.executable}" -m baselines.horovod "{spec_file}" {address[0]} '
                f"{address[1]} {authkey.hex()}")
        cmd = ["srun", f"--nodes={len(self.nodes)}", f"--ntasks={len(specs)}",
               f"--ntasks-per-node={self.per_node}", *cpus_per_task(self.per_node),
               "--distribution=block", "--kill-on-bad-exit=1", "--job-name=pipebench-horovod",
               "bash", "-c", task]
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


def main(argv: list[str]) -> None:
    """Entry point of one rank under horovodrun: SPEC_FILE HOST PORT AUTHKEY_HEX."""
    import horovod.torch as hvd

    hvd.init()
    spec = pickle.loads(Path(argv[0]).read_bytes())
    spec = dataclasses.replace(spec, rank=hvd.rank(), local_rank=hvd.local_rank())
    connect_back(spec, argv[1], int(argv[2]), argv[3])


if __name__ == "__main__":
    main(sys.argv[1:])
