"""Two hosts made of network namespaces (scripts/netns_hosts.sh): PipeDream under torchrun
and Horovod under horovodrun (ssh into the second namespace) across a real veth link, each
equal to its single-machine reference; a link cut mid-run ends both sides within 30 s with
non-zero exits, a message naming the cause, and no process left in either namespace.

Needs root, iproute2 and openssh-server (scripts/install_sshd.sh); without them the tests
fail and say so. The namespaces are torn down even when a test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pipedream_impl.planner.plan import Plan, Stage
from pipedream_impl.runtime.contract import RunSettings, SystemSettings, WorkerSpec
from pipedream_impl.runtime.local import local_executors, run_local
from pipedream_impl.runtime.worker import ORPHAN_CHECK_S
from tests.pipeline_reference import assert_close, single_process_reference
from workloads.registry import get

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[1]
NETNS = REPO / "scripts" / "netns_hosts.sh"
BIN = Path(sys.executable).parent
BOUNDS = ((0, 12), (12, 40))
STEPS = 6
SSH_PORT = 2222
CUT_BOUND_S = 30.0  # the link is cut: every side must be gone within this
CUT_TIMEOUT_S = 10  # --timeout of the runs that get cut


@dataclass(frozen=True)
class Hosts:
    ns: tuple[str, str]
    addr: tuple[str, str]
    iface: str
    ssh: Path  # keys, configs and the ssh wrapper
    sshd_pid: int


def _sh(*cmd: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{' '.join(cmd)} failed: {r.stderr.strip()}"
    return r.stdout


def _pids(ns: str) -> set[int]:
    return {int(p) for p in _sh("ip", "netns", "pids", ns).split()}


def _kill_every_process(ns: str) -> None:
    """SIGKILL every process in ``ns``. One that ends between the listing and its kill is
    gone already (``kill`` with the whole list failed the test on such a race once)."""
    for pid in _pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait(done: Callable[[], bool], deadline_s: float, what: str,
          procs: tuple[subprocess.Popen, ...] = ()) -> None:
    """Poll ``done`` until it holds; fail after ``deadline_s`` or when a process ends."""
    end = time.monotonic() + deadline_s
    while not done():
        ended = [p.returncode for p in procs if p.poll() is not None]
        assert not ended, f"a process ended (exit codes {ended}) while waiting for {what}"
        assert time.monotonic() < end, f"no {what} within {deadline_s:.0f}s"
        time.sleep(0.05)


def _start_sshd(ns: str, addr: str, d: Path) -> int:
    """An sshd inside ``ns`` on ``addr:SSH_PORT`` that lets root in with a fresh test key
    only, and an ``ssh`` wrapper (first on PATH) that uses that key and a private
    known_hosts, so nothing under ~/.ssh is read or written."""
    d.mkdir(parents=True)
    for key in ("client", "host"):
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key))
    shutil.copy(d / "client.pub", d / "authorized_keys")
    (d / "sshd_config").write_text(
        f"Port {SSH_PORT}\nListenAddress {addr}\nHostKey {d / 'host'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nStrictModes no\nUsePAM no\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nClientAliveInterval 2\nClientAliveCountMax 3\n"
        "LogLevel ERROR\n")
    (d / "ssh_config").write_text(
        f"Host *\n  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking no\n"
        f"  IdentityFile {d / 'client'}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        "  LogLevel ERROR\n  ConnectTimeout 10\n")
    (d / "bin").mkdir()
    wrapper = d / "bin" / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {d / "ssh_config"} "$@"\n')
    wrapper.chmod(0o755)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    _sh("ip", "netns", "exec", ns, shutil.which("sshd") or "/usr/sbin/sshd",
        "-f", str(d / "sshd_config"))
    # the command returns when sshd forks into the background; the child writes its pid
    # file once it listens, which may be a moment later
    pid_file = d / "sshd.pid"
    _wait(lambda: pid_file.exists() and pid_file.read_text().strip().isdigit(), 30,
          "sshd's pid file")
    return int(pid_file.read_text())


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    missing = [what for what, ok in (
        ("root", os.geteuid() == 0), ("iproute2's ip", shutil.which("ip")),
        ("sshd (scripts/install_sshd.sh installs it)", shutil.which("sshd")
         or Path("/usr/sbin/sshd").exists()),
        ("ssh and ssh-keygen", shutil.which("ssh") and shutil.which("ssh-keygen")))
        if not ok]
    if missing:
        pytest.fail("multi-node tests need " + ", ".join(missing), pytrace=False)
    prefix = f"pbt{os.getpid() % 1_000_000}"
    env = dict(line.split("=", 1) for line in _sh(str(NETNS), "env", prefix).split())
    try:
        _sh(str(NETNS), "up", prefix)
        ns, addr = (env["NS0"], env["NS1"]), (env["ADDR0"], env["ADDR1"])
        ssh = tmp_path_factory.mktemp("ssh")
        pid = _start_sshd(ns[1], addr[1], ssh / "d")
        yield Hosts(ns, addr, env["IFACE"], ssh / "d", pid)
    finally:
        _sh(str(NETNS), "down", prefix)  # kills what is left inside, sshd included


def _leftovers(hosts: Hosts) -> set[int]:
    return _pids(hosts.ns[0]) | (_pids(hosts.ns[1]) - {hosts.sshd_pid})


@pytest.fixture
def clean(hosts: Hosts) -> Iterator[Hosts]:
    """The hosts for one test: afterwards nothing but sshd may be left in them (10 s grace:
    sshd's session of a dropped connection ends by ClientAlive); what is left is killed, the
    link brought back up, and the test errors."""
    yield hosts
    end = time.monotonic() + 10
    while (left := _leftovers(hosts)) and time.monotonic() < end:
        time.sleep(0.05)
    if left:
        subprocess.run(["kill", "-KILL", *map(str, left)], check=False)
    for ns in hosts.ns:
        subprocess.run(["ip", "-n", ns, "link", "set", hosts.iface, "up"], check=False)
    assert not left, f"processes left in the hosts after the test: {sorted(left)}"


def _env(hosts: Hosts) -> dict[str, str]:
    return {**os.environ, "GLOO_SOCKET_IFNAME": hosts.iface, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO), "PATH": f"{hosts.ssh / 'bin'}:{BIN}:{os.environ['PATH']}"}


def _torchrun(hosts: Hosts, plan: Path, out: Path, port: int, timeout: int,
              epochs: int, steps: int) -> list[subprocess.Popen]:
    procs = []
    for i, ns in enumerate(hosts.ns):
        cmd = ["ip", "netns", "exec", ns, str(BIN / "torchrun"), "--nnodes", "2",
               "--nproc-per-node", "1", "--node-rank", str(i), "--master-addr", hosts.addr[0],
               "--master-port", str(port), "--rdzv-conf", "timeout=60", "-m",
               "pipedream_impl.runtime.torchrun_worker", "--workload", "vgg16", "--scale",
               "tiny", "--plan", str(plan), "--epochs", str(epochs), "--max-steps", str(steps),
               "--timeout", str(timeout), "--out", str(out)]
        log = open(out.parent / f"torchrun{i}.log", "w")  # noqa: SIM115 - the child keeps it
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=_env(hosts), stdout=log,
                                      stderr=subprocess.STDOUT))
    return procs


def _horovodrun(hosts: Hosts, out: Path, timeout: int, epochs: int,
                steps: int) -> subprocess.Popen:
    # each rank records its exit code and time in out/exit.<rank> (rank 1's is on "host 1")
    if not (BIN / "horovodrun").exists():
        pytest.fail(f"no {BIN / 'horovodrun'}: make install builds Horovod", pytrace=False)
    worker = ('"$1" -m baselines.horovod_worker "${@:3}"; rc=$?; '
              'echo "$rc $(date +%s.%N)" > "$2/exit.$HOROVOD_RANK"; exit $rc')
    cmd = ["ip", "netns", "exec", hosts.ns[0], str(BIN / "horovodrun"), "--gloo", "-np", "2",
           "-H", f"{hosts.addr[0]}:1,{hosts.addr[1]}:1", "--network-interface", hosts.iface,
           "--ssh-port", str(SSH_PORT), "--ssh-identity-file", str(hosts.ssh / "client"),
           "--start-timeout", "60", "--disable-cache",
           "bash", "-c", worker, "worker", sys.executable, str(out),
           "--workload", "vgg16", "--scale", "tiny", "--epochs", str(epochs), "--max-steps",
           str(steps), "--timeout", str(timeout), "--out", str(out)]
    out.mkdir(parents=True)
    log = open(out.parent / "horovodrun.log", "w")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(cmd, cwd=REPO, env=_env(hosts), stdout=log,
                            stderr=subprocess.STDOUT)


def _log(out: Path, name: str) -> str:
    return (out.parent / name).read_text(errors="replace")


def _first_epoch(out: Path, procs: tuple[subprocess.Popen, ...]) -> None:
    """Wait until both ranks reported an epoch: the run demonstrably crosses the link."""
    _wait(lambda: all((out / f"rank{r}.jsonl").exists() for r in (0, 1)), 180,
          "first epoch report from both ranks", procs)


def _cut_after_first_epoch(hosts: Hosts, out: Path, procs: tuple[subprocess.Popen, ...]) \
        -> float:
    """Take host 1's end of the link down once the run is under way; returns when."""
    _first_epoch(out, procs)
    _sh("ip", "-n", hosts.ns[1], "link", "set", hosts.iface, "down")
    return time.monotonic()


def _straight_plan(path: Path) -> Path:
    plan = Plan((Stage(BOUNDS[0], 1, (0,), 0.0), Stage(BOUNDS[1], 1, (1,), 0.0)), 2, {})
    path.write_text(plan.to_json())
    return path


def _exited_within(p: subprocess.Popen, t_cut: float) -> float:
    p.wait(timeout=CUT_BOUND_S + 30)  # past the bound: still measured, then failed below
    return time.monotonic() - t_cut


def test_two_node_pipedream_under_torchrun_equals_the_in_process_run(clean: Hosts,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "out"
    procs = _torchrun(clean, _straight_plan(tmp_path / "plan.json"), out, 29531, 60, 1, STEPS)
    for i, p in enumerate(procs):
        assert p.wait(timeout=240) == 0, _log(out, f"torchrun{i}.log")[-3000:]
    spec = WorkerSpec(0, RunSettings("vgg16", "tiny", 0, 32, max_steps=STEPS, timeout_s=60.0),
                      SystemSettings((1, 1), BOUNDS))
    reference = run_local(local_executors(spec), 0)
    for stage, rep in enumerate(reference):  # same ops, same order, one thread: bit-identical
        got = torch.load(out / f"stage{stage}_replica0.pt")
        assert list(got) == list(rep.state)
        assert all(torch.equal(got[k], rep.state[k]) for k in got), stage
        row = json.loads((out / f"rank{stage}.jsonl").read_text())
        assert row["losses"] == rep.losses  # the last stage's losses; empty on stage 0


def test_two_node_horovod_under_horovodrun_equals_one_process(clean: Hosts,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _horovodrun(clean, out, 60, 1, STEPS)
    assert p.wait(timeout=240) == 0, _log(out, "horovodrun.log")[-3000:]
    assert [(out / f"exit.{r}").read_text().split()[0] for r in (0, 1)] == ["0", "0"]
    wl = get("vgg16")
    ref_model, ref_stats = single_process_reference(wl, wl.default_data("tiny", 0), STEPS)
    s0, s1 = (torch.load(out / f"stage0_replica{r}.pt") for r in (0, 1))
    assert all(torch.equal(s0[k], s1[k]) for k in s0)  # the replicas agree exactly
    for name, ref in ref_model.named_parameters():  # and equal one process on the global
        # batch up to the order of float sums
        assert_close(name, s0[name], ref)
    rows = [json.loads((out / f"rank{r}.jsonl").read_text()) for r in (0, 1)]
    assert all(len(r["losses"]) == STEPS for r in rows)
    mean = sum(sum(r["losses"]) for r in rows) / (2 * STEPS)  # each rank: its half-batch
    assert mean == pytest.approx(ref_stats.train_loss, rel=1e-4)


def test_a_cut_link_ends_both_torchrun_nodes_within_the_bound(clean: Hosts,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "out"
    procs = _torchrun(clean, _straight_plan(tmp_path / "plan.json"), out, 29532, CUT_TIMEOUT_S,
                      1000, 2)
    t_cut = _cut_after_first_epoch(clean, out, tuple(procs))
    took = [_exited_within(p, t_cut) for p in procs]
    print(f"torchrun: link cut -> node 0 exited after {took[0]:.1f}s, node 1 after "
          f"{took[1]:.1f}s")
    assert max(took) < CUT_BOUND_S, took
    assert [p.returncode for p in procs] == [1, 1]
    assert not _leftovers(clean)  # no orphans
    for rank in (0, 1):  # each side says what happened, in its log and in torchrun's summary
        said = "did not answer within --timeout (network link down or peer hung)"
        assert said in (out / f"rank{rank}.error").read_text()
        log = _log(out, f"torchrun{rank}.log")
        assert f"rank {rank} on" in log and said in log.split("Root Cause")[-1]


def test_a_cut_link_ends_both_horovod_hosts_within_the_bound(clean: Hosts,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _horovodrun(clean, out, CUT_TIMEOUT_S, 1000, 2)
    t_cut = _cut_after_first_epoch(clean, out, (p,))
    host1_gone = lambda: _pids(clean.ns[1]) <= {clean.sshd_pid}  # noqa: E731
    took0 = _exited_within(p, t_cut)
    _wait(host1_gone, max(1.0, t_cut + CUT_BOUND_S + 30 - time.monotonic()),
          "host 1 without worker processes")
    took1 = time.monotonic() - t_cut
    print(f"horovod: link cut -> host 0 (horovodrun) exited after {took0:.1f}s, "
          f"host 1 empty after {took1:.1f}s")
    assert took0 < CUT_BOUND_S and took1 < CUT_BOUND_S, (took0, took1)
    assert p.returncode != 0
    # horovodrun's children end with it (a worker checks its launcher every
    # ORPHAN_CHECK_S): one still exiting as horovodrun returns is not a leftover, one
    # alive after the bound is (under make test one was still listed at that instant)
    _wait(lambda: not _pids(clean.ns[0]), 10 * ORPHAN_CHECK_S, "host 0 without processes")
    log = _log(out, "horovodrun.log")
    said = "did not answer within --timeout (network link down or peer hung)"
    assert said in log, log[-3000:]  # rank 0's own line, through horovodrun's output
    assert said in (out / "rank1.error").read_text()  # rank 1's, on host 1's disk
    assert all(int((out / f"exit.{r}").read_text().split()[0]) != 0 for r in (0, 1))


# "torchrun" passes as well (host 1 empty 4-5 s after the kill); left out to keep this file
# near 3 minutes on 2 cores
@pytest.mark.parametrize("launcher", ["horovodrun"])
def test_killing_host_0_ends_host_1_within_the_bound(clean: Hosts, tmp_path: Path,
                                                     launcher: str) -> None:
    """Host 0 runs torchrun's rendezvous store, or horovodrun itself: SIGKILL every
    process on it, and host 1's side must notice and leave nothing behind."""
    out = tmp_path / "out"
    if launcher == "torchrun":
        procs = _torchrun(clean, _straight_plan(tmp_path / "plan.json"), out, 29533,
                          CUT_TIMEOUT_S, 1000, 2)
    else:
        procs = [_horovodrun(clean, out, CUT_TIMEOUT_S, 1000, 2)]
    _first_epoch(out, tuple(procs))
    t_kill = time.monotonic()
    _kill_every_process(clean.ns[0])
    _wait(lambda: _pids(clean.ns[1]) <= {clean.sshd_pid}, CUT_BOUND_S + 30,
          "host 1 without worker processes")
    took = time.monotonic() - t_kill
    print(f"{launcher}: host 0 killed -> host 1 empty after {took:.1f}s")
    assert took < CUT_BOUND_S
    for p in procs:
        p.wait(timeout=10)
    code = procs[1].returncode if launcher == "torchrun" else \
        int((out / "exit.1").read_text().split()[0])
    assert code == 1
    assert "a peer worker went away (its process or host died)" in \
        (out / "rank1.error").read_text()
