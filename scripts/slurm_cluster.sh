#!/usr/bin/env bash
# A throwaway two-node Slurm cluster on one machine, for rehearsing benchmark runs submitted
# as Slurm jobs: the two "hosts" of scripts/netns_hosts.sh (network namespaces PREFIX-h0 on
# 10.77.0.1 and PREFIX-h1 on 10.77.0.2, joined by a veth pair) become compute nodes PREFIX-h0
# and PREFIX-h1 of one partition, `debug`.
#
#   scripts/slurm_cluster.sh up   [PREFIX]   # namespaces, munged, slurmctld, 2 slurmd; wait idle
#   scripts/slurm_cluster.sh down [PREFIX]   # kill them all, delete the namespaces and state
#   scripts/slurm_cluster.sh env  [PREFIX]   # print SLURM_CONF= CLIENT_NS= ... (shell syntax)
#
# How: everything lives in a state directory, /tmp/pipebench-slurm-PREFIX: slurm.conf (the
# daemons and every client command find it through SLURM_CONF), a fresh MUNGE key and a
# private munged (its socket named by slurm.conf's AuthInfo, so nothing under /etc/munge or
# /run/munge is used), StateSaveLocation, one spool directory per slurmd, pid files, logs and
# the job completion log. No system service is started and nothing is written under
# /etc/slurm. Every daemon runs as root inside a namespace: munged and slurmctld (on
# 10.77.0.1) in PREFIX-h0, one slurmd in each; `down` kills them by pid file, then
# netns_hosts.sh down kills whatever is left inside the namespaces (stray job processes).
# Each slurmd (and slurmctld) also gets its own UTS namespace whose host name is its node
# name, so `hostname` in a job prints the node it runs on, and slurmctld recognises itself in
# SlurmctldHost. The node names are the namespace names, which the namespaces' /etc/hosts
# (netns_hosts.sh) already map to their addresses: `scontrol show hostnames` gives names that
# torch's MASTER_ADDR can use as they are.
# Client commands (sbatch, srun, squeue, scancel, scontrol, sinfo) must run inside a namespace
# that reaches 10.77.0.1, and srun must be reachable by the slurmds: run them in CLIENT_NS
# (PREFIX-h0, the "login node", also compute node 0): `ip netns exec PREFIX-h0 sbatch ...`
# with SLURM_CONF from `env` in the environment. The file system is shared: a job's --output
# and the repository's .venv are the same paths on both nodes.
# Settings are for a container without systemd or cgroup delegation (proctrack/linuxproc,
# task/none) and no accounting database: sacct does not work; a finished job's state stays in
# `scontrol show job` for MinJobAge (1 h) and forever in JOBCOMP (jobcomp/filetxt).
# `up` and `down` are idempotent: `up` on a healthy cluster does nothing, on a half-made one
# it starts over; `down` on nothing does nothing. A failed `up` prints the log tails and
# tears down what it started. `down` removes the state directory unless
# SLURM_CLUSTER_KEEP_STATE is set (to read the logs); SLURM_CLUSTER_UP_TIMEOUT (default 60 s)
# bounds the wait for idle nodes. Daemons count as dead once zombies: this container's init
# reaps orphans seconds late. Needs root, iproute2, util-linux's unshare and
# scripts/install_slurm.sh's packages.
set -euo pipefail

cmd=${1:-}
PREFIX=${2:-pb}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NETNS="$HERE/netns_hosts.sh"
DIR="/tmp/pipebench-slurm-$PREFIX"
CONF="$DIR/slurm.conf"
MUNGE_SOCKET="$DIR/munge/munged.socket"
PARTITION=debug
UP_TIMEOUT_S=${SLURM_CLUSTER_UP_TIMEOUT:-60}
[[ "$PREFIX" =~ ^[A-Za-z0-9][A-Za-z0-9-]{0,11}$ ]] \
  || { echo "slurm_cluster.sh: prefix '$PREFIX' must be 1-12 letters, digits or dashes" >&2
       exit 1; }
# The namespaces' names, addresses and interface, as netns_hosts.sh makes them.
NS_ENV=$("$NETNS" env "$PREFIX")
eval "$NS_ENV"
NODE0=$NS0
NODE1=$NS1
CLIENT_NS=$NS0

die() { echo "slurm_cluster.sh: $*" >&2; exit 1; }

usage() { die "usage: slurm_cluster.sh up|down|env [PREFIX]"; }

check_tools() {
  [ "$(id -u)" -eq 0 ] || die "the cluster needs root (run as root or with sudo)"
  for tool in ip unshare munged mungekey slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] \
      || die "'$tool' not found: scripts/install_slurm.sh installs Slurm and MUNGE"
  done
}

# The client commands, with this cluster's configuration, inside the client namespace.
client() { SLURM_CONF="$CONF" ip netns exec "$CLIENT_NS" "$@"; }

alive() {  # $1: pid; a zombie is dead (an init that reaps late, as in some containers,
  # leaves a killed daemon a zombie for seconds, which kill -0 still finds)
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

pid_of() {  # $1: pid file; prints the pid when that process is alive
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" && echo "$pid"
}

PIDFILES=("$DIR/munge/munged.pid" "$DIR/slurmctld.pid" "$DIR/slurmd-$NODE0.pid"
          "$DIR/slurmd-$NODE1.pid")

nodes_idle() {  # both nodes registered and idle (or already running jobs)
  local states
  states=$(client timeout 10 sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null) || return 1
  for node in "$NODE0" "$NODE1"; do
    grep -Eq "^$node (idle|mix|alloc)\$" <<<"$states" || return 1
  done
}

healthy() {
  for f in "${PIDFILES[@]}"; do pid_of "$f" >/dev/null || return 1; done
  nodes_idle
}

stop_daemons() {  # SIGTERM by pid file, SIGKILL what is left after 5 s
  local pids=() pid
  for f in "${PIDFILES[@]}"; do
    if pid=$(pid_of "$f"); then pids+=("$pid"); fi
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 50); do
    local left=()
    for pid in "${pids[@]}"; do alive "$pid" && left+=("$pid"); done
    [ ${#left[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "${left[@]}" 2>/dev/null || true
}

down() {
  stop_daemons
  "$NETNS" down "$PREFIX"  # kills job processes left in the namespaces (slurmstepd, tasks)
  # the state directory is ours alone (fixed name from a checked prefix): remove it whole
  if [ -z "${SLURM_CLUSTER_KEEP_STATE:-}" ]; then rm -rf "$DIR"; fi
}

write_conf() {
  cat > "$CONF" <<EOF
# scripts/slurm_cluster.sh: a throwaway two-node cluster in network namespaces $NS0/$NS1
ClusterName=pb$(tr -cd 'a-z0-9' <<<"${PREFIX,,}" | cut -c1-30)
SlurmctldHost=$NODE0($ADDR0)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$DIR/plugstack.conf
# no systemd, no cgroup delegation: track job processes through /proc, bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# no accounting database: every finished job is one line here (JobState=...)
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.log
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# a finished job stays in scontrol show job this long (s)
MinJobAge=3600
# grace between SIGTERM and SIGKILL at scancel, at the time limit and when a node fails
# (s): Slurm's default. With 5, a run stopping its workers on a loaded machine (make test's
# two test processes) was once SIGKILLed before it could end its MLflow run KILLED
KillWait=30
# a dead slurmd: its node goes DOWN and its jobs NODE_FAIL ~25 s after the kill. The ping
# interval is SlurmdTimeout/3, but each ping of a refused port retries for ~10 s and it takes
# two failed pings, so below 5 nothing is gained (10 gives ~30 s)
SlurmdTimeout=5
# a node that was DOWN comes back by itself when its slurmd registers
ReturnToService=2
# a batch job on a failed node ends (NODE_FAIL) instead of being requeued
JobRequeue=0
InactiveLimit=0
# the nodes claim 2 CPUs each whatever this machine has (oversubscription is fine)
SlurmdParameters=config_overrides
NodeName=$NODE0 NodeAddr=$ADDR0 NodeHostname=$NODE0 CPUs=2 State=UNKNOWN
NodeName=$NODE1 NodeAddr=$ADDR1 NodeHostname=$NODE1 CPUs=2 State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE0,$NODE1 Default=YES MaxTime=INFINITE State=UP
EOF
}

# $1: namespace, $2: host name in a UTS namespace of its own, $3...: the daemon, which
# forks into the background and writes its pid file
start_in() {
  local ns=$1 name=$2
  shift 2
  # shellcheck disable=SC2016 # expanded by that sh
  SLURM_CONF="$CONF" ip netns exec "$ns" unshare --uts \
    sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

wait_for() {  # $1: seconds, $2...: a test command
  local end=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.2
  done
}

fail_up() {
  echo "slurm_cluster.sh: $*" >&2
  for f in "$DIR/log/munged.log" "$DIR/log/slurmctld.log" "$DIR/log/slurmd-$NODE0.log" \
           "$DIR/log/slurmd-$NODE1.log"; do
    [ -f "$f" ] && { echo "--- tail of $f" >&2; tail -n 15 "$f" >&2; }
  done
  client timeout 10 sinfo -N >&2 2>&1 || true
  down
  exit 1
}

up() {
  if healthy; then
    return 0
  fi
  down  # half-made: start over
  rm -rf "$DIR"  # even when kept (SLURM_CLUSTER_KEEP_STATE): a new cluster starts empty
  "$NETNS" up "$PREFIX" >/dev/null
  mkdir -p "$DIR/munge" "$DIR/ctld" "$DIR/log" "$DIR/spool-$NODE0" "$DIR/spool-$NODE1"
  # munged wants its socket's directory searchable by all, and no one else writing there
  chmod 755 "$DIR" "$DIR/munge"
  : > "$DIR/plugstack.conf"  # no SPANK plugins (not /etc/slurm/plugstack.conf)
  write_conf
  # slurmd loads a cgroup plugin even when no other plugin uses it; autodetection fails on
  # the fresh sysfs that `ip netns exec` mounts (no /sys/fs/cgroup): name v1, lazy and unused
  echo "CgroupPlugin=cgroup/v1" > "$DIR/cgroup.conf"
  mungekey --create --keyfile="$DIR/munge/munge.key" 2>/dev/null \
    || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$DIR/munge/munge.key"
  ip netns exec "$NS0" munged --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed" \
    || fail_up "munged did not start"
  wait_for 10 test -S "$MUNGE_SOCKET" || fail_up "munged made no socket"
  # -i: no saved state to recover (fresh directory), so no complaint about its absence
  start_in "$NS0" "$NODE0" slurmctld -i || fail_up "slurmctld did not start"
  start_in "$NS0" "$NODE0" slurmd -N "$NODE0" || fail_up "slurmd $NODE0 did not start"
  start_in "$NS1" "$NODE1" slurmd -N "$NODE1" || fail_up "slurmd $NODE1 did not start"
  wait_for "$UP_TIMEOUT_S" nodes_idle \
    || fail_up "nodes $NODE0, $NODE1 not idle within ${UP_TIMEOUT_S}s"
  for f in "${PIDFILES[@]}"; do
    pid_of "$f" >/dev/null || fail_up "no live daemon behind $f"
  done
}

case "$cmd" in
  up) check_tools; up
      echo "slurm_cluster.sh: nodes $NODE0 ($ADDR0), $NODE1 ($ADDR1) idle;" \
        "client commands: SLURM_CONF=$CONF ip netns exec $CLIENT_NS ..." ;;
  down) [ "$(id -u)" -eq 0 ] || die "the cluster needs root (run as root or with sudo)"
        down ;;
  env)
       printf '%s=%s\n' SLURM_CONF "$CONF" CLIENT_NS "$CLIENT_NS" NODE0 "$NODE0" \
         NODE1 "$NODE1" ADDR0 "$ADDR0" ADDR1 "$ADDR1" IFACE "$IFACE" \
         PARTITION "$PARTITION" STATE_DIR "$DIR" MUNGE_SOCKET "$MUNGE_SOCKET" \
         JOBCOMP "$DIR/jobcomp.log" ;;
  *) usage ;;
esac
