"""``pipebench run --launcher slurm`` on a real Slurm cluster of two nodes.

The cluster is Debian's Slurm and MUNGE (scripts/install_slurm.sh), started by
scripts/slurm_cluster.sh: slurmctld and one slurmd per network namespace of
scripts/netns_hosts.sh, so the two nodes talk over a real (veth) link; client commands
run in the first namespace, the "login node". Each test submits through the real command
and compares with an independent reference: the same run on this machine's local launcher,
which must give bit-identical training (the epochs' losses and qualities in MLflow).
- two-node jobs of our runtime (pipedream) and of Horovod equal their local runs, and their
  MLflow runs are like local ones, with each node's system metrics;
- ``scancel`` mid-run: the run ends KILLED with its newest checkpoint, and ``--resume`` in
  a new job continues the same MLflow run to the same numbers as an uninterrupted run;
- a node's slurmd killed mid-run: the job ends NODE_FAIL within ``LOST_BOUND_S``, naming
  the node, and the run KILLED; a node that dies (its slurmd and every process on it
  killed): the job ends within ``LOST_BOUND_S``, naming the node and the rank.

Needs root, iproute2, util-linux's unshare and the Slurm packages (the fixture installs
them with apt when missing); the cluster is torn down even when a test fails.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.paths import REPO

pytestmark = pytest.mark.multiprocess

CLUSTER = REPO / "scripts" / "slurm_cluster.sh"
PIPEBENCH = str(Path(sys.executable).parent / "pipebench")
BOUNDS = ((0, 12), (12, 40))
RUN = ["run", "--workload", "vgg16", "--workers", "2", "--threads", "1", "--max-steps", "8",
       "--target", "2"]
LOST_BOUND_S = 60.0  # a node dies: the job must have ended within this


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    missing = [what for what, ok in (("root", os.geteuid() == 0), ("iproute2's ip",
                                      shutil.which("ip")), ("unshare", shutil.which("unshare")))
               if not ok]
    if missing:
        pytest.fail("the Slurm tests need " + ", ".join(missing), pytrace=False)
    subprocess.run([str(REPO / "scripts" / "install_slurm.sh")], check=True, timeout=600)
    prefix = f"pbs{os.getpid() % 100_000}"
    try:
        subprocess.run([str(CLUSTER), "up", prefix], check=True, timeout=120,
                       capture_output=True)
        out = subprocess.run([str(CLUSTER), "env", prefix], check=True, capture_output=True,
                             text=True).stdout
        env = dict(line.split("=", 1) for line in out.split())
        work = tmp_path_factory.mktemp("slurm")
        from pipedream_impl.planner.plan import Plan, Stage

        plan = Plan(tuple(Stage(b, 1, (i,), 0.0) for i, b in enumerate(BOUNDS)), 2, {})
        (work / "plan.json").write_text(plan.to_json())
        env.update(WORK=str(work), URI=f"sqlite:///{work}/mlflow.db", PREFIX=prefix)
        import mlflow  # the store's tables made once: jobs that start together race to

        mlflow.MlflowClient(tracking_uri=env["URI"]).search_experiments()  # create them
        yield env
    finally:
        subprocess.run([str(CLUSTER), "down", prefix], timeout=120, check=False)


def _env(c: dict[str, str]) -> dict[str, str]:
    """The login node's environment: the cluster's config, the store, and the network
    interface the nodes share (as on a cluster with several)."""
    return {**os.environ, "SLURM_CONF": c["SLURM_CONF"], "MLFLOW_TRACKING_URI": c["URI"],
            "GLOO_SOCKET_IFNAME": c["IFACE"]}


def _submit(c: dict[str, str], args: list[str]) -> subprocess.Popen:
    """``pipebench ARGS --launcher slurm --nodes 2`` on the login node, followed."""
    return subprocess.Popen(["ip", "netns", "exec", c["CLIENT_NS"], PIPEBENCH, *args,
                             "--launcher", "slurm", "--nodes", "2"], cwd=c["WORK"],
                            env=_env(c), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _local(c: dict[str, str], args: list[str]) -> None:
    env = {k: v for k, v in _env(c).items() if k != "GLOO_SOCKET_IFNAME"}  # not here
    r = subprocess.run([PIPEBENCH, *args, "--quiet"], cwd=c["WORK"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def _run(uri: str, experiment: str):  # noqa: ANN202 - the experiment's one mlflow run
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


def _history(uri: str, experiment: str) -> dict[str, list[tuple[int, float]]]:
    """Each epoch's training loss and quality (step, value), in step order."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    run_id = _run(uri, experiment).info.run_id
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k))
            for k in ("train_loss", "quality")}


def _job_id(proc: subprocess.Popen, seen: list[str]) -> str:
    """The job id from the submission's first line (kept in ``seen``)."""
    for line in proc.stdout:
        seen.append(line)
        if m := re.search(r"submitted job (\d+)", line):
            return m.group(1)
    raise AssertionError("no job submitted:\n" + "".join(seen))


def _wait_for(what: str, done, deadline_s: float) -> None:  # noqa: ANN001 - a predicate
    end = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < end, f"no {what} within {deadline_s:.0f} s"
        time.sleep(0.1)  # polling a file the job writes, with a deadline


def test_two_node_jobs_equal_the_local_runs(cluster: dict[str, str]) -> None:
    """Our runtime (one torchrun per node) and Horovod (its gloo rendezvous, ranks started
    by srun), submitted together: each job's training equals the local run's."""
    layout = {"pipedream": ["--plan", f"{cluster['WORK']}/plan.json"], "horovod": []}
    args = {s: [*RUN, "--system", s, *extra, "--epochs", "2"] for s, extra in layout.items()}
    jobs = {s: _submit(cluster, [*a, "--experiment", f"job-{s}"]) for s, a in args.items()}
    for s, a in args.items():
        _local(cluster, [*a, "--experiment", f"here-{s}"])
    nodes = f"{cluster['NODE0'].rsplit('-', 1)[0]}-h[0-1]"
    for s, proc in jobs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        assert f"RUNNING on {nodes}" in out and "completed: state COMPLETED" in out, out
        job = _run(cluster["URI"], f"job-{s}")
        assert job.info.status == "FINISHED"
        for node in (cluster["NODE0"], cluster["NODE1"]):  # each node's, in the one run
            assert f"system/{node}/cpu_utilization_percentage" in job.data.metrics, (
                s, sorted(job.data.metrics))
        assert job.data.params["config"] == ("1-1" if s == "pipedream" else "2")
        assert _history(cluster["URI"], f"job-{s}") == _history(cluster["URI"], f"here-{s}")


def test_scancel_checkpoints_and_a_new_job_resumes_bit_identically(
        cluster: dict[str, str]) -> None:
    work = Path(cluster["WORK"])
    ckpt = work / "ckpt"
    args = [*RUN, "--system", "pipedream", "--plan", f"{work}/plan.json", "--epochs", "4",
            "--max-steps", "24"]
    proc = _submit(cluster, [*args, "--experiment", "cancelled", "--checkpoint-dir",
                             str(ckpt)])
    seen: list[str] = []
    job = _job_id(proc, seen)
    _wait_for("checkpoint", lambda: (ckpt / "latest").exists(), 240)
    subprocess.run(["ip", "netns", "exec", cluster["CLIENT_NS"], "scancel", job],
                   env=_env(cluster), check=True)
    out = "".join(seen) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, out
    assert f"job {job} cancelled (scancel): state CANCELLED" in out, out
    cancelled = _run(cluster["URI"], "cancelled")
    assert cancelled.info.status == "KILLED"
    done = int((ckpt / "latest").read_text().strip().split("-")[1])
    assert 1 <= done < 4, "the job finished before it was cancelled: nothing was tested"

    resumed = _submit(cluster, ["run", "--resume", str(ckpt)])
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out
    again = _run(cluster["URI"], "cancelled")  # the same MLflow run, continued
    assert again.info.run_id == cancelled.info.run_id and again.info.status == "FINISHED"
    _local(cluster, [*args, "--experiment", "uninterrupted"])
    assert _history(cluster["URI"], "cancelled") == _history(cluster["URI"], "uninterrupted")


def _long_job(cluster: dict[str, str], experiment: str) -> tuple[subprocess.Popen, list[str]]:
    """A job that would run for minutes, once its first epoch is done."""
    args = [*RUN, "--system", "pipedream", "--plan", f"{cluster['WORK']}/plan.json",
            "--epochs", "200", "--experiment", experiment, "--timeout", "20"]
    subprocess.run([str(CLUSTER), "up", cluster["PREFIX"]], check=True, timeout=120,
                   capture_output=True)  # both nodes up (a test before may have lost one)
    proc = _submit(cluster, args)
    seen: list[str] = []
    _job_id(proc, seen)
    output = Path(re.search(r"its output: (\S+)", "".join(seen)).group(1))
    _wait_for("first epoch", lambda: output.exists() and "epoch 1/" in output.read_text(), 240)
    return proc, seen


def test_a_lost_slurmd_ends_the_job_naming_the_node(cluster: dict[str, str]) -> None:
    """Only the node's slurmd dies (its workers go on): Slurm notices (SlurmdTimeout),
    ends the job NODE_FAIL and stops the launcher, which ends the run KILLED; pipebench
    names the node Slurm holds down."""
    proc, seen = _long_job(cluster, "lost-slurmd")
    node = cluster["NODE1"]
    t0 = time.monotonic()
    os.kill(int(Path(cluster["STATE_DIR"], f"slurmd-{node}.pid").read_text()), signal.SIGKILL)
    out = "".join(seen) + proc.communicate(timeout=LOST_BOUND_S + 60)[0]
    took = time.monotonic() - t0
    assert took < LOST_BOUND_S, f"the job took {took:.0f} s to end:\n{out}"
    assert proc.returncode == 1, out
    assert "lost a node: state NODE_FAIL" in out and f"down: {node}" in out, out
    assert _run(cluster["URI"], "lost-slurmd").info.status == "KILLED"


def test_a_node_that_dies_ends_the_job_naming_node_and_rank(cluster: dict[str, str]) -> None:
    proc, seen = _long_job(cluster, "lost")
    node = cluster["NODE1"]
    pids = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True,
                          check=True).stdout.split()
    t0 = time.monotonic()
    for pid in pids:  # the node dies: its slurmd and every process on it
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    out = "".join(seen) + proc.communicate(timeout=LOST_BOUND_S + 60)[0]
    took = time.monotonic() - t0
    assert took < LOST_BOUND_S, f"the job took {took:.0f} s to end:\n{out}"
    assert proc.returncode == 1, out
    assert re.search(rf"rank 1\b[^\n]* on {node}", out), out
    assert _run(cluster["URI"], "lost").info.status == "FAILED"
