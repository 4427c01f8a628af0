"""``pipebench run --launcher slurm``'s terminal side: write the batch script, print it
(``--dry-run``) or submit it and follow the job to its end (``harness.experiments.slurm_job``
holds the script and the Slurm commands; this module the files, the output and the exit
code)."""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import typer

from harness.cli.app import console
from harness.config import RunConfig

__all__ = ["JOBS_DIR", "submit_run"]

JOBS_DIR = ".pipebench-jobs"  # under the submit directory: scripts and job output


def submit_run(cfg: RunConfig, flags: SimpleNamespace, argv: list[str], quiet: bool) -> None:
    """Submit ``cfg``'s run (``argv``: its arguments for the job) and follow it; exit 1
    unless the job completed."""
    from harness.experiments.slurm_job import JobRequest, batch_script, follow, submit
    from harness.reporting import tracking

    req = JobRequest(nodes=flags.nodes, gpus_per_node=flags.gpus_per_node,
                     partition=flags.partition, time=flags.time_limit,
                     cpus_per_node=(cfg.threads * cfg.workers // flags.nodes
                                    if cfg.threads else None),
                     extra=tuple(flags.sbatch_arg or ()))
    req.check(cfg.workers)
    cwd = Path.cwd()
    workdir = cwd / JOBS_DIR
    env = {"MLFLOW_TRACKING_URI": tracking.default_tracking_uri(), "PYTHONUNBUFFERED": "1"}
    for name in ("PIPEBENCH_LOCAL_TRACKING_URI", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    name = f"pipebench-{cfg.system}-{cfg.workload}"
    # one stem per submission: a job id Slurm reuses (a new cluster) finds no old output
    stem = workdir / f"{name}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"
    script = batch_script(argv, req, name, f"{stem}-%j.out", cwd, env)
    workdir.mkdir(exist_ok=True)  # Slurm opens the output file there before the script runs
    if flags.dry_run:
        sys.stdout.write(script)
        return
    path = stem.with_suffix(".sh")
    path.write_text(script)
    job = submit(path)
    output = Path(f"{stem}-{job}.out")
    say = (lambda _: None) if quiet else (lambda text: console.print(
        text, highlight=False, markup=False, soft_wrap=True))  # paths unbroken
    say(f"submitted job {job} ({path}); its output: {output}")
    try:
        end = follow(job, output, (lambda _: None) if quiet else _echo, say)
    except KeyboardInterrupt:
        console.print(f"stopped following job {job}; it keeps running (squeue -j {job}; "
                      f"scancel {job} stops it)", highlight=False, markup=False,
                      soft_wrap=True)
        raise typer.Exit(130) from None
    if not end.ok:
        console.print(end.describe(), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)
    say(end.describe())


def _echo(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
