"""Workers across the nodes of a Slurm allocation: one ``srun`` job step, one torchrun per node.

Why: on a cluster the run is a Slurm job (``pipebench run --launcher slurm`` submits one;
``docs/multi-node.md``). The launcher (epochs, evaluation, MLflow, checkpoints, the
failure handling of ``launcher``) runs where the batch script runs, the allocation's
first node, exactly as on one machine; only the workers start differently:
``srun --ntasks-per-node=1`` starts one ``torchrun`` per node, which starts that node's
workers with a static rendezvous on the first node (``--node-rank $SLURM_NODEID``, so
ranks 0..G-1 sit on the first node, the next G on the second, ...). Each worker sets up
``torch.distributed`` through ``env://`` and connects back to the launcher
(``remote.connect_back``), as Horovod's ranks do.

Where: torchrun's rendezvous is the first node's ``NodeAddr``; the workers reach the
launcher at its own node's (``PIPEBENCH_HEAD_ADDR`` overrides it; under ``salloc`` on a
login node, the login node's address). Each step gets the node's CPUs
(``SLURM_CPUS_ON_NODE``) as ``--cpus-per-task``. The spec
file goes to the job's submit directory, which every node must see (a shared
filesystem, as Slurm's own output files assume). ``GLOO_SOCKET_IFNAME`` /
``NCCL_SOCKET_IFNAME`` pass through to the workers (srun exports the environment).

Failure: ``--kill-on-bad-exit`` ends the step when one worker exits non-zero; a node that
dies ends it with Slurm's message naming the node, which the launcher's failure message
carries (the step's output tail).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipedream_impl.runtime import JOBS_DIR
from pipedream_impl.runtime.contract import WorkerSpec
from pipedream_impl.runtime.launcher import PipelineFailure, free_port
from pipedream_impl.runtime.remote import PopenHandle, SocketLauncher, connect_back

__all__ = ["SrunHandle", "SrunLauncher", "cpus_per_task", "job_nodes", "launcher_address",
           "node_address"]

REPO = Path(__file__).resolve().parents[2]


def _scontrol(*args: str) -> str:
    r = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise PipelineFailure(f"scontrol {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def job_nodes() -> list[str]:
    """The allocation's node names, in Slurm's order (the first runs the batch script)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist or shutil.which("scontrol") is None:
        raise PipelineFailure("--launcher srun runs inside a Slurm allocation (sbatch, "
                              "salloc): SLURM_JOB_NODELIST is not set or scontrol is missing; "
                              "use --launcher slurm to submit a job")
    return _scontrol("show", "hostnames", nodelist).split()


def node_address(node: str) -> str:
    """The address the other nodes reach ``node`` at: its NodeAddr in Slurm."""
    for field in _scontrol("show", "node", node, "-o").split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return node


def launcher_address() -> str:
    """Where the workers reach this process: ``PIPEBENCH_HEAD_ADDR``; else, on a node of
    the job (the batch script), that node's NodeAddr; else (``salloc`` on a login node)
    the address of this host's name."""
    if os.environ.get("PIPEBENCH_HEAD_ADDR"):
        return os.environ["PIPEBENCH_HEAD_ADDR"]
    if os.environ.get("SLURMD_NODENAME"):
        return node_address(os.environ["SLURMD_NODENAME"])
    return socket.gethostbyname(socket.gethostname())


def cpus_per_task(tasks_per_node: int) -> list[str]:
    """srun's ``--cpus-per-task`` for a step of ``tasks_per_node`` tasks per node: the
    node's CPUs in the job, shared evenly (a step inherits no CPU count from the batch
    script on every Slurm version); none outside a job."""
    cpus = os.environ.get("SLURM_CPUS_ON_NODE")
    return [f"--cpus-per-task={max(1, int(cpus) // tasks_per_node)}"] if cpus else []


class SrunHandle(PopenHandle):
    """srun as a worker handle: killing it kills the job step's tasks on every node (two
    SIGINTs within a second make srun SIGKILL every task; a SIGKILL to srun itself would
    leave them running on the other nodes), then srun."""

    def kill(self) -> None:
        for _ in range(2):
            try:
                os.killpg(self.popen.pid, signal.SIGINT)
            except ProcessLookupError:
                return
            time.sleep(0.2)  # srun's second SIGINT must come within a second of the first
        self.join(timeout=10)
        super().kill()


class SrunLauncher(SocketLauncher):
    """Our runtime's workers (and the torch peers', DDP's) across a Slurm allocation: one
    srun step of one torchrun per node, the static rendezvous on the first node; the
    workers connect back to this process wherever it runs (the batch script's node, or a
    login node under salloc). The watchdog sees the progress boards of this node's
    workers only (a rank stuck on another node is found by its peers' timeouts)."""

    name = "srun"
    bind = "0.0.0.0"  # workers on every node of the allocation connect
    handle = SrunHandle

    def _start(self, specs: list[WorkerSpec]) -> None:
        self.nodes = job_nodes()
        if len(specs) % len(self.nodes):
            raise PipelineFailure(f"{len(specs)} workers do not split evenly over the "
                                  f"allocation's {len(self.nodes)} nodes "
                                  f"({', '.join(self.nodes)}): give --workers a multiple "
                                  f"of {len(self.nodes)}")
        self.per_node = len(specs) // len(self.nodes)
        self.master = node_address(self.nodes[0])  # torchrun's rendezvous
        self.advertise = launcher_address()
        shared = Path(os.environ.get("SLURM_SUBMIT_DIR", os.getcwd())) / JOBS_DIR
        shared.mkdir(exist_ok=True)
        self.spec_dir = str(shared)
        super()._start(specs)

    def monitor(self, sampler: str, *args: object) -> None:
        """The first worker of every node but the launcher's runs ``sampler(*args, node)``
        (``remote._MonitoredControl``)."""
        for i, node in enumerate(self.nodes[1:], start=1):
            self.controls[i * self.per_node].put(("monitor", sampler, *args, node))

    def where(self, rank: int) -> str:
        """As on one machine, plus the node the rank ran on."""
        return f"{super().where(rank)} on {self.nodes[rank // self.per_node]}"

    def _command(self, specs: list[WorkerSpec], spec_file: Path, address: tuple[str, int],
                 authkey: bytes) -> tuple[list[str], dict[str, str]]:
        nodes, per_node = len(self.nodes), self.per_node
        torchrun = Path(sys.executable).parent / "torchrun"
        # one torchrun per node; its node rank is the node's index in the step
        agent = (f'exec "{torchrun}" --nnodes {nodes} --nproc-per-node {per_node} '
                 f'--node-rank "$SLURM_NODEID" --master-addr {self.master} '
                 f"--master-port {free_port()} -m pipedream_impl.runtime.srun "
                 f'"{spec_file}" {address[0]} {address[1]} {authkey.hex()}')
        cmd = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
               *cpus_per_task(1), "--kill-on-bad-exit=1", "--job-name=pipebench-workers",
               "bash", "-c", agent]
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        return cmd, env


def main(argv: list[str]) -> None:
    """One worker under torchrun in the job step: SPEC_FILE HOST PORT AUTHKEY_HEX."""
    spec: WorkerSpec = pickle.loads(Path(argv[0]).read_bytes())
    boards = spec.progress_dir if Path(spec.progress_dir).is_dir() else ""  # first node only
    spec = dataclasses.replace(spec, rank=int(os.environ["RANK"]),
                               local_rank=int(os.environ["LOCAL_RANK"]),
                               init_method="env://", launcher_pid=0, progress_dir=boards)
    connect_back(spec, argv[1], int(argv[2]), argv[3])


if __name__ == "__main__":
    main(sys.argv[1:])
