"""``--launcher slurm``'s terminal side, for ``run`` and ``bench``: write the batch script,
print it (``--dry-run``) or submit it and follow the job to its end
(``harness.experiments.slurm_job`` holds the script and the Slurm commands; this module
the job's command line, the files, the output and the exit code)."""

from __future__ import annotations

import datetime
import inspect
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import typer

from core.errors import UserInputError
from harness.cli.app import console
from harness.cli.options import SUBMIT_ONLY
from pipedream_impl.runtime import JOBS_DIR, LAUNCHERS

__all__ = ["check_launcher", "job_argv", "submit_job"]


def check_launcher(flags: SimpleNamespace) -> None:
    """``--launcher`` and the options that only a Slurm submission reads."""
    if flags.launcher not in LAUNCHERS:
        raise UserInputError(f"--launcher must be one of {', '.join(LAUNCHERS)} "
                             f"(got {flags.launcher!r})")
    if flags.launcher == "srun" and not os.environ.get("SLURM_JOB_NODELIST"):
        raise UserInputError("--launcher srun runs inside a Slurm allocation (the job that "
                             "--launcher slurm submits, or salloc); SLURM_JOB_NODELIST is "
                             "not set")
    if flags.dry_run and flags.launcher != "slurm":
        raise UserInputError("--dry-run prints a Slurm job's script: give --launcher slurm")


def job_argv(name: str, command: Callable, flags: SimpleNamespace) -> list[str]:
    """``command``'s arguments for the job's own run of it: every option not at its
    default, less the submission's own, then ``--launcher srun``."""
    argv: list[str] = [name]
    hints = typing.get_type_hints(command, include_extras=True)
    for key, param in inspect.signature(command).parameters.items():
        value = getattr(flags, key)
        if key in SUBMIT_ONLY or value == param.default:
            continue
        flag = _flag(hints[key], key)
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{key.replace('_', '-')}")
        elif isinstance(value, list):
            argv += [x for v in value for x in (flag, str(v))]
        else:
            argv += [flag, str(value)]
    return [*argv, "--launcher", "srun"]


def _flag(hint: object, key: str) -> str:
    """The option's long name as the command declares it (``--json`` for ``json_out``),
    else typer's default for the parameter."""
    for meta in getattr(hint, "__metadata__", ()):
        # in Annotated, typer.Option's first argument (``default``) is a name, not a default
        decls = (getattr(meta, "default", None), *(getattr(meta, "param_decls", None) or ()))
        for d in decls:
            if isinstance(d, str) and d.startswith("--"):
                return d
    return "--" + key.replace("_", "-")


def submit_job(name: str, workers: list[int], cpus_per_node: int | None,
               flags: SimpleNamespace, argv: list[str], quiet: bool) -> None:
    """Submit the job running ``argv`` (``workers``: each run's worker count, which every
    node must share evenly; ``cpus_per_node``: None for whole nodes) and follow it; exit 1
    unless the job completed."""
    from harness.experiments.slurm_job import JobRequest, batch_script, submit

    req = JobRequest(nodes=flags.nodes, gpus_per_node=flags.gpus_per_node,
                     partition=flags.partition, time=flags.time_limit,
                     cpus_per_node=cpus_per_node, extra=tuple(flags.sbatch_arg or ()))
    for n in sorted(set(workers)):
        req.check(n)
    workdir = Path.cwd() / JOBS_DIR
    # one stem per submission: a job id Slurm reuses (a new cluster) finds no old output
    stem = workdir / f"{name}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"
    script = batch_script(argv, req, name, f"{stem}-%j.out", Path.cwd(), _travelling_env())
    workdir.mkdir(exist_ok=True)  # Slurm opens the output file there before the script runs
    if flags.dry_run:
        sys.stdout.write(script)
        return
    path = stem.with_suffix(".sh")
    path.write_text(script)
    job = submit(path)
    _follow(job, path, Path(f"{stem}-{job}.out"), quiet)


def _travelling_env() -> dict[str, str]:
    """What the job's environment must hold whatever sbatch's --export: the MLflow store
    (resolved here), the machine's name for suite history, the network interfaces."""
    from harness.reporting import tracking

    env = {"MLFLOW_TRACKING_URI": tracking.default_tracking_uri(), "PYTHONUNBUFFERED": "1"}
    for var in ("PIPEBENCH_LOCAL_TRACKING_URI", "PIPEBENCH_MACHINE", "GLOO_SOCKET_IFNAME",
                "NCCL_SOCKET_IFNAME"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    return env


def _follow(job: str, script: Path, output: Path, quiet: bool) -> None:
    from harness.experiments.slurm_job import follow

    say = (lambda _: None) if quiet else (lambda text: console.print(
        text, highlight=False, markup=False, soft_wrap=True))  # paths unbroken
    say(f"submitted job {job} ({script}); its output: {output}")
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
