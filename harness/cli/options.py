"""Options that several commands share, declared once with their help text.

Why: a command's signature is its list of flags; with the common ones named here, each
flag is one line and a command stays short (tests/harness/cli/test_cli_shape.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["SUBMIT_ONLY", "Device", "DryRun", "Epochs", "GpusPerNode", "Launcher", "MaxSteps",
           "Nodes", "Output", "Partition", "Quiet", "SbatchArg", "Scale", "Seed", "TimeLimit",
           "Workload"]

Workload = Annotated[str, typer.Option("--workload", "-w", help="see `pipebench workloads`")]
Scale = Annotated[str, typer.Option(help="tiny, small or full")]
Epochs = Annotated[int | None, typer.Option(help="epoch budget (default: workload's)")]
Seed = Annotated[int, typer.Option(help="random seed")]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda")]
MaxSteps = Annotated[int | None, typer.Option(help="cap on steps per epoch")]
Quiet = Annotated[bool, typer.Option(help="no progress output")]
Output = Annotated[str | None, typer.Option("--output", "-o", help="markdown report")]

# where the workers run, and what a Slurm job asks for (run, bench)
Launcher = Annotated[str, typer.Option(
    help="local: workers on this machine; slurm: submit this as a Slurm job (sbatch) and "
         "follow it; srun: inside a Slurm allocation, workers on every node")]
Nodes = Annotated[int, typer.Option(help="--launcher slurm: nodes (--workers split evenly)")]
GpusPerNode = Annotated[int, typer.Option(
    help="--launcher slurm: GPUs per node (one worker each)")]
Partition = Annotated[str | None, typer.Option(help="--launcher slurm: partition")]
TimeLimit = Annotated[str | None, typer.Option(
    "--time", help="--launcher slurm: time limit (Slurm's format, e.g. 1:00:00)")]
DryRun = Annotated[bool, typer.Option(
    help="--launcher slurm: print the batch script (and make its output folder), submit "
         "nothing")]
SbatchArg = Annotated[list[str] | None, typer.Option(
    help="--launcher slurm: another sbatch option, verbatim (repeatable), e.g. "
         "--sbatch-arg=--account=proj")]
# the options that shape the job, not the run: not passed on to the job's own run
SUBMIT_ONLY = ("launcher", "nodes", "gpus_per_node", "partition", "time_limit", "dry_run",
                "sbatch_arg")
