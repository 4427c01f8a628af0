"""Multi-machine entry point: the same ``worker_main`` under torchrun's rendezvous.

On one machine ``pipebench run --system pipedream`` spawns the workers itself. Across
machines, start this module with torchrun on every machine (same plan file everywhere)::

    torchrun --nnodes 2 --nproc-per-node 4 --node-rank I --master-addr host0 \\
        --master-port 29500 -m pipedream_impl.runtime.torchrun_worker \\
        --workload vgg16 --scale full --plan plan.json --epochs 1 --timeout 60 --out runs/vgg16

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; the workers
rendezvous through ``env://`` (NCCL on GPUs, gloo otherwise; ``GLOO_SOCKET_IFNAME`` picks
the network interface). With no launcher process to evaluate between epochs, each rank runs
the epoch budget (``ScriptedControl``) and writes (``FileSink``), per epoch, a JSON line of
its report to ``--out/rank<R>.jsonl`` and its stage weights to
``--out/stage<S>_replica<I>.pt``; a rank that fails writes ``--out/rank<R>.error``.

Failures: every receive and all-reduce waits at most ``--timeout`` seconds, so a cut link
or a dead peer host ends each surviving rank with exit code 1 and one line saying what
happened (``describe_failure``), also handed to torchrun's error file so its summary names
it; torchrun (no restarts by default) then stops and exits non-zero on every machine.

The flags, ``RunSettings`` and the scripted control/sink are shared with the other
scripted multi-machine worker (``baselines.horovod_worker``): ``scripted_parser``,
``run_settings`` and ``run_scripted``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from pipedream_impl.planner.plan import Plan
from pipedream_impl.runtime.contract import (
    EpochReport,
    RunSettings,
    SystemSettings,
    WorkerSpec,
)
from pipedream_impl.runtime.worker import worker_main

__all__ = ["FileSink", "ScriptedControl", "describe_failure", "main", "run_scripted",
           "run_settings", "scripted_parser"]

# what a peer's death or a cut link looks like in the last line of a worker's traceback
_PEER_DIED = ("Connection reset by peer", "Connection closed by peer", "Connection refused",
              "Broken pipe")
_NO_ANSWER = ("Timed out", "timed out", "did not complete within", "Timeout")


class ScriptedControl:
    """What the launcher would say: run epochs 0..n-1, then stop."""

    def __init__(self, epochs: int) -> None:
        self.messages = [("epoch", e) for e in range(epochs)] + [("stop",)]

    def get(self, timeout: float | None = None) -> tuple:  # noqa: ARG002 - queue interface
        return self.messages.pop(0)


def describe_failure(rank: int, trace: str) -> str:
    """One line for a worker's traceback: the exception, and what it means across hosts."""
    lines = [x for x in trace.strip().splitlines() if x.strip()]
    last = lines[-1].strip() if lines else "unknown error"
    where = f"rank {rank} on {socket.gethostname()}"
    if any(s in last for s in _PEER_DIED):
        cause = "a peer worker went away (its process or host died)"
    elif any(s in last for s in _NO_ANSWER):
        cause = "a peer did not answer within --timeout (network link down or peer hung)"
    else:
        return f"{where} failed: {last}"
    return f"{where} failed: {cause}: {last}"


class FileSink:
    """Where a scripted worker's results go: report lines and weights under ``out``; an
    error goes to ``out/rank<R>.error``, torchrun's error file and stderr (traceback, then
    one summary line)."""

    def __init__(self, out: Path, rank: int) -> None:
        self.out, self.rank = out, rank
        out.mkdir(parents=True, exist_ok=True)

    def put(self, message: tuple) -> None:
        kind, rank, payload = message
        if kind == "error":
            summary = describe_failure(rank, payload)
            # on disk first: across machines stderr may lead nowhere (a cut ssh session)
            (self.out / f"rank{rank}.error").write_text(f"{summary}\n\n{payload}")
            self._error_file(summary, payload)
            try:
                print(f"rank {rank} failed:\n{payload}\n{summary}", file=sys.stderr,
                      flush=True)
            except OSError:
                pass
            return
        if kind != "epoch":  # nothing else is meant for a file
            return
        report: EpochReport = payload
        if report.state is not None:
            torch.save(report.state, self.out / f"stage{report.stage}_replica{report.replica}.pt")
        row = {k: v for k, v in asdict(report).items() if k != "state"}
        row["payload"] = {f"{a}->{b}": n for (a, b), n in report.payload.items()}
        row["header"] = {f"{a}->{b}": n for (a, b), n in report.header.items()}
        with open(self.out / f"rank{self.rank}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    @staticmethod
    def _error_file(summary: str, trace: str) -> None:
        """torchrun's per-worker error file (its format), so its failure summary shows the
        traceback and the summary line instead of 'To enable traceback see ...'."""
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if not path:
            return
        data = {"message": {"message": summary,
                            "extraInfo": {"py_callstack": f"{trace.rstrip()}\n{summary}",
                                          "timestamp": str(int(time.time()))}}}
        try:
            Path(path).write_text(json.dumps(data))
        except OSError:
            pass  # the summary is on stderr anyway


def scripted_parser(description: str, out: str) -> argparse.ArgumentParser:
    """The flags every scripted multi-machine worker shares: the run, its budget, ``--out``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--workload", required=True)
    p.add_argument("--scale", default="tiny")
    p.add_argument("--data", default=None, help="dataset path (default: the workload's)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=None,
                   help="global minibatch (default: the workload's)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None, help="minibatches per epoch, at most")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds any receive or all-reduce may wait for a peer")
    p.add_argument("--out", default=out, help="folder for rank<R>.jsonl and weights")
    return p


def run_settings(a: argparse.Namespace) -> RunSettings:
    """``RunSettings`` from ``scripted_parser``'s flags (threads: OMP_NUM_THREADS, else 1)."""
    from workloads import registry

    return RunSettings(
        workload=a.workload, scale=a.scale, seed=a.seed,
        batch_size=a.batch_size or registry.get(a.workload).spec(a.scale).batch_size,
        lr=a.lr, data=a.data, max_steps=a.max_steps,
        threads=int(os.environ.get("OMP_NUM_THREADS", "1")),
        device="cuda" if torch.cuda.is_available() else "cpu", timeout_s=a.timeout)


def run_scripted(spec: WorkerSpec, a: argparse.Namespace, sink: FileSink | None = None) -> None:
    """Run ``--epochs`` epochs of ``spec`` and write them under ``--out`` (or to ``sink``);
    exits 1 on error."""
    worker_main(spec, ScriptedControl(a.epochs), sink or FileSink(Path(a.out), spec.rank))


def main(argv: list[str] | None = None) -> None:
    p = scripted_parser(__doc__.split("\n\n")[0], out="pipedream-run")
    p.add_argument("--plan", required=True, help="plan JSON (pipebench plan -o)")
    p.add_argument("--weights", default="stash")
    a = p.parse_args(argv)
    plan = Plan.from_json(Path(a.plan).read_text())
    rank = int(os.environ["RANK"])
    if int(os.environ["WORLD_SIZE"]) != plan.workers:
        sys.exit(f"the plan needs {plan.workers} workers, torchrun started "
                 f"{os.environ['WORLD_SIZE']}: give torchrun --nnodes x --nproc-per-node = "
                 f"{plan.workers}")
    system = SystemSettings(replicas=tuple(s.replicas for s in plan.stages),
                            bounds=tuple(tuple(s.layers) for s in plan.stages),
                            weights=a.weights)
    spec = WorkerSpec(rank, run_settings(a), system, init_method="env://",
                      local_rank=int(os.environ.get("LOCAL_RANK", rank)))
    run_scripted(spec, a)


if __name__ == "__main__":
    main()
