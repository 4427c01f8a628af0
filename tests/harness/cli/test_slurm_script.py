"""``pipebench run --launcher slurm --dry-run``: the batch script a user can submit.

The job's own command line must mean the same run: its arguments, parsed by the real
``run`` command, give the same ``RunConfig`` as the submitting command's flags (only the
launcher differs). The ``#SBATCH`` lines follow the request; bad requests are refused
before anything is submitted. (The job itself, on a real Slurm cluster:
``tests/test_slurm.py``.)
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli.app import app

FLAGS = ["--system", "gpipe", "--workload", "vgg16", "--workers", "4", "--max-steps",
         "6", "--epochs", "2", "--checkpoint-dir", "ck", "--recompute", "--seed", "3",
         "--lr", "0.05", "--microbatches", "8", "--timeout", "30.5"]


def _script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> str:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    r = CliRunner().invoke(app, ["run", *FLAGS, "--launcher", "slurm", "--dry-run", *extra])
    assert r.exit_code == 0, r.output
    return r.output


def _said(r) -> str:  # noqa: ANN001 - a click Result: output, or the error main() prints
    return r.output + str(r.exception or "")


def _captured_config(monkeypatch: pytest.MonkeyPatch, argv: list[str]):  # noqa: ANN202
    """The RunConfig the real ``run`` command builds from ``argv`` (the run is stopped
    before it starts)."""
    seen = []

    class Stop(Exception):
        pass

    def fake(cfg, progress=None, resume=None):  # noqa: ANN001, ANN202, ARG001
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr("harness.experiments.runner.run", fake)
    r = CliRunner().invoke(app, argv)
    assert isinstance(r.exception, Stop), r.output
    return seen[0]


def test_the_job_runs_the_same_run_with_srun(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script(tmp_path, monkeypatch, "--nodes", "2", "--partition", "gpu",
                     "--time", "1:00:00", "--sbatch-arg=--account=proj")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    sbatch = [x for x in lines if x.startswith("#SBATCH ")]
    assert sbatch[:3] == ["#SBATCH --job-name=pipebench-gpipe-vgg16",
                          "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1"]
    for want in ("--partition=gpu", "--time=1:00:00", "--signal=B:TERM@60",
                 "--account=proj"):
        assert f"#SBATCH {want}" in sbatch
    (output,) = [x for x in sbatch if x.startswith("#SBATCH --output=")]
    assert re.fullmatch(rf"#SBATCH --output={tmp_path}/\.pipebench-jobs/"
                        r"pipebench-gpipe-vgg16-[0-9-]+-%j\.out", output), output
    assert "#SBATCH --exclusive" in sbatch  # no --threads: whole nodes
    assert (tmp_path / ".pipebench-jobs").is_dir()  # Slurm needs it before the job starts
    assert f"cd {tmp_path}" in lines
    assert f"export MLFLOW_TRACKING_URI=sqlite:///{tmp_path}/m.db" in lines
    exec_line = next(x for x in lines if x.startswith("exec "))
    argv = shlex.split(exec_line)[2:]
    assert argv[0] == "run" and argv[-2:] == ["--launcher", "srun"]
    here = _captured_config(monkeypatch, ["run", *FLAGS])
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[0-1]")  # inside the job
    job = _captured_config(monkeypatch, argv)
    assert job.launcher == "srun" and here.launcher == "local"
    assert job.replace(launcher="local") == here


def test_gpus_and_worker_counts_must_fit_the_nodes(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script(tmp_path, monkeypatch, "--nodes", "2", "--gpus-per-node", "2",
                     "--threads", "3")
    assert "#SBATCH --gpus-per-node=2" in script.splitlines()
    assert "#SBATCH --cpus-per-task=6" in script.splitlines()  # 3 threads x 2 workers
    runner = CliRunner()
    for extra, why in ((["--nodes", "3"], "does not split evenly over --nodes 3"),
                       (["--nodes", "2", "--gpus-per-node", "4"], "must be --nodes x "
                        "--gpus-per-node = 8")):
        r = runner.invoke(app, ["run", *FLAGS, "--launcher", "slurm", "--dry-run", *extra])
        assert r.exit_code != 0 and why in _said(r), _said(r)
    r = runner.invoke(app, ["run", *FLAGS, "--launcher", "nowhere"])
    assert r.exit_code != 0 and "--launcher must be one of local, slurm, srun" in _said(r)
    r = runner.invoke(app, ["run", *FLAGS, "--dry-run"])
    assert r.exit_code != 0 and "give --launcher slurm" in _said(r)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    r = runner.invoke(app, ["run", *FLAGS, "--launcher", "srun"])
    assert r.exit_code != 0 and "runs inside a Slurm allocation" in _said(r)


def test_a_suite_is_one_job_whose_bench_has_the_same_options(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Options named unlike their parameter (--json, --systems) and repeated ones (--plant)
    reach the job's own bench as given."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["bench", "--systems", "pipedream,ddp", "--workers", "4",
                                 "--json", "out.json", "--plant", "ddp=slow:*:*:1.2",
                                 "--plant", "pipedream=slow:1:F:1.1", "--launcher", "slurm",
                                 "--nodes", "2", "--dry-run"])
    assert r.exit_code == 0, _said(r)
    exec_line = next(x for x in r.output.splitlines() if x.startswith("exec "))
    assert shlex.split(exec_line)[2:] == [
        "bench", "--json", "out.json", "--workers", "4", "--systems", "pipedream,ddp",
        "--plant", "ddp=slow:*:*:1.2", "--plant", "pipedream=slow:1:F:1.1",
        "--launcher", "srun"]
    assert "#SBATCH --job-name=pipebench-bench-adhoc" in r.output
    # a one-process cell runs the threads of all 4 workers on one node
    assert "#SBATCH --cpus-per-task=4" in r.output.splitlines()
    r = CliRunner().invoke(app, ["bench", "--systems", "pipedream", "--workers", "3",
                                 "--launcher", "slurm", "--nodes", "2", "--dry-run"])
    assert r.exit_code != 0 and "does not split evenly over --nodes 2" in _said(r)
