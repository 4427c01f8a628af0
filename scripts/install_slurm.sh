#!/usr/bin/env bash
# Install what scripts/slurm_cluster.sh needs for a throwaway two-node Slurm cluster: Debian's
# Slurm controller, compute daemon and client commands (slurmctld, slurmd, slurm-client:
# sbatch, srun, squeue, scancel, scontrol, sinfo, sacct) and MUNGE, which Slurm
# authenticates with (apt). slurm_cluster.sh runs its own munged and Slurm daemons with a
# private key, config and state directory; this script starts no service and leaves none
# running: Debian's postinst scripts would start munge, slurmctld and slurmd through
# invoke-rc.d, which a policy-rc.d that exits 101 forbids for the length of the install.
# Idempotent: when the daemons and the client commands are present it installs nothing
# (milliseconds). Without root or sudo it says so and exits 0, so a bootstrap as an
# ordinary user goes on (the Slurm tests then fail, naming what is missing).
set -euo pipefail

log() { printf '\033[1m[install_slurm]\033[0m %s\n' "$*"; }

PKGS=(slurmctld slurmd slurm-client munge)

if [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] \
   && command -v sbatch >/dev/null 2>&1 && command -v srun >/dev/null 2>&1 \
   && command -v scontrol >/dev/null 2>&1; then
  exit 0
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    log "not root and no sudo: skipping ${PKGS[*]} (needed by scripts/slurm_cluster.sh)"
    exit 0
  fi
  SUDO=(sudo)
fi

# Forbid service starts during the install, unless a policy already does (Docker images
# ship one that exits 101): ours is removed afterwards, theirs is left alone.
POLICY=/usr/sbin/policy-rc.d
OURS=0
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\n# scripts/install_slurm.sh: no service starts during the install\nexit 101\n' \
    | "${SUDO[@]}" tee "$POLICY" >/dev/null
  "${SUDO[@]}" chmod 755 "$POLICY"
  OURS=1
fi
cleanup() { [ "$OURS" = 1 ] && "${SUDO[@]}" rm -f "$POLICY"; return 0; }
trap cleanup EXIT

log "installing ${PKGS[*]} with apt-get (seconds)"
export DEBIAN_FRONTEND=noninteractive
if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null; then
  # a fresh container has no package lists; a stale one may name versions no longer served
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
fi

# With systemd as init, deb-systemd-invoke may bypass policy-rc.d: stop whatever started.
if [ -d /run/systemd/system ]; then
  for unit in slurmctld slurmd munge; do
    "${SUDO[@]}" systemctl stop "$unit" 2>/dev/null || true
    "${SUDO[@]}" systemctl disable "$unit" 2>/dev/null || true
  done
fi
for daemon in slurmctld slurmd munged; do
  if pgrep -x "$daemon" >/dev/null 2>&1; then
    log "warning: a $daemon is running (not started by this script, left alone)"
  fi
done
