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

Where: the launcher is told the first node's address by Slurm (``NodeAddr`` of the
first host in ``SLURM_JOB_NODELIST``; ``PIPEBENCH_HEAD_ADDR`` overrides it). The spec
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
import subprocess
import sys
from pathlib import Path

from pipedream_impl.runtime.contract import WorkerSpec
from pipedream_impl.runtime.launcher import PipelineFailure, free_port
from pipedream_impl.runtime.remote import SocketLauncher, connect_back

__all__ = ["SrunLauncher", "head_address", "job_nodes"]

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


def head_address(node: str) -> str:
    """The address the workers reach ``node`` at: ``PIPEBENCH_HEAD_ADDR``, else its
    NodeAddr in Slurm."""
    if os.environ.get("PIPEBENCH_HEAD_ADDR"):
        return os.environ["PIPEBENCH_HEAD_ADDR"]
    for field in _scontrol("show", "node", node, "-o").split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return node


class SrunLauncher(SocketLauncher):
    name = "srun"
    bind = "0.0.0.0"  # workers on every node of the allocation connect

    def _start(self, specs: list[WorkerSpec]) -> None:
        self.nodes = job_nodes()
        if len(specs) % len(self.nodes):
            raise PipelineFailure(f"{len(specs)} workers do not split evenly over the "
                                  f"allocation's {len(self.nodes)} nodes "
                                  f"({', '.join(self.nodes)}): give --workers a multiple "
                                  f"of {len(self.nodes)}")
        self.per_node = len(specs) // len(self.nodes)
        self.advertise = head_address(self.nodes[0])
        shared = Path(os.environ.get("SLURM_SUBMIT_DIR", os.getcwd())) / ".pipebench-jobs"
        shared.mkdir(exist_ok=True)
        self.spec_dir = str(shared)
        super()._start(specs)

    def monitor(self, run_id: str, uri: str, interval_s: float) -> None:
        """The first worker of every node but the launcher's samples that node's system
        metrics into the run, under ``system/<node>/`` (``remote.connect_back``)."""
        for i, node in enumerate(self.nodes[1:], start=1):
            self.controls[i * self.per_node].put(("monitor", run_id, uri, interval_s, node))

    def where(self, rank: int) -> str:
        """As on one machine, plus the node the rank ran on."""
        return f"{super().where(rank)} on {self.nodes[rank // self.per_node]}"

    def _command(self, specs: list[WorkerSpec], spec_file: Path, address: tuple[str, int],
                 authkey: bytes) -> tuple[list[str], dict[str, str]]:
        nodes, per_node = len(self.nodes), self.per_node
        torchrun = Path(sys.executable).parent / "torchrun"
        # one torchrun per node; its node rank is the node's index in the step
        agent = (f'exec "{torchrun}" --nnodes {nodes} --nproc-per-node {per_node} '
                 f'--node-rank "$SLURM_NODEID" --master-addr {self.advertise} '
                 f"--master-port {free_port()} -m pipedream_impl.runtime.srun "
                 f'"{spec_file}" {address[0]} {address[1]} {authkey.hex()}')
        cmd = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
               "--kill-on-bad-exit=1", "--job-name=pipebench-workers", "bash", "-c", agent]
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
