"""Multi-machine entry point: the same ``worker_main`` under torchrun's rendezvous.

On one machine ``pipebench run --system pipedream`` spawns the workers itself. Across
machines, start this module with torchrun on every machine (same plan file everywhere)::

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint host0:29500 -m pipedream_impl.runtime.torchrun_worker \\
        --workload vgg16 --scale full --plan plan.json --epochs 1 --out runs/vgg16

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; the workers
rendezvous through ``env://`` (NCCL on GPUs, gloo otherwise). With no launcher process to
evaluate between epochs, each rank runs the epoch budget and writes, per epoch, a JSON line
of its report to ``--out/rank<R>.jsonl`` and its stage weights to
``--out/stage<S>_replica<I>.pt``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from pipedream_impl.planner.plan import Plan
from pipedream_impl.runtime.contract import (
    EpochReport,
    RunSettings,
    SystemSettings,
    WorkerSpec,
    worker_main,
)

__all__ = ["FileSink", "ScriptedControl", "main"]


class ScriptedControl:
    """What the launcher would say: run epochs 0..n-1, then stop."""

    def __init__(self, epochs: int) -> None:
        self.messages = [("epoch", e) for e in range(epochs)] + [("stop",)]

    def get(self, timeout: float | None = None) -> tuple:  # noqa: ARG002 - queue interface
        return self.messages.pop(0)


class FileSink:
    def __init__(self, out: Path, rank: int) -> None:
        self.out, self.rank = out, rank
        out.mkdir(parents=True, exist_ok=True)

    def put(self, message: tuple) -> None:
        kind, rank, payload = message
        if kind == "error":
            print(f"rank {rank} failed:\n{payload}", file=sys.stderr)
            return
        report: EpochReport = payload
        if report.state is not None:
            torch.save(report.state, self.out / f"stage{report.stage}_replica{report.replica}.pt")
        row = {k: v for k, v in asdict(report).items() if k != "state"}
        row["payload"] = {f"{a}->{b}": n for (a, b), n in report.payload.items()}
        row["header"] = {f"{a}->{b}": n for (a, b), n in report.header.items()}
        with open(self.out / f"rank{self.rank}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True)
    p.add_argument("--scale", default="tiny")
    p.add_argument("--plan", required=True, help="plan JSON (pipebench plan -o)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--weights", default="stash")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--out", default="pipedream-run")
    a = p.parse_args(argv)
    from workloads import registry

    plan = Plan.from_json(Path(a.plan).read_text())
    rank = int(os.environ["RANK"])
    if int(os.environ["WORLD_SIZE"]) != plan.workers:
        sys.exit(f"the plan needs {plan.workers} workers, torchrun started "
                 f"{os.environ['WORLD_SIZE']}")
    run = RunSettings(
        workload=a.workload, scale=a.scale, seed=a.seed,
        batch_size=a.batch_size or registry.get(a.workload).spec(a.scale).batch_size,
        max_steps=a.max_steps, threads=int(os.environ.get("OMP_NUM_THREADS", "1")),
        device="cuda" if torch.cuda.is_available() else "cpu", timeout_s=a.timeout)
    system = SystemSettings(replicas=tuple(s.replicas for s in plan.stages),
                            bounds=tuple(tuple(s.layers) for s in plan.stages),
                            weights=a.weights)
    spec = WorkerSpec(rank, run, system, init_method="env://",
                      local_rank=int(os.environ.get("LOCAL_RANK", rank)))
    worker_main(spec, ScriptedControl(a.epochs), FileSink(Path(a.out), rank))


if __name__ == "__main__":
    main()
