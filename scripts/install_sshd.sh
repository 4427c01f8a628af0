#!/usr/bin/env bash
# Install what tests/test_multinode.py needs to start horovodrun's remote ranks over ssh:
# OpenSSH's server and client (apt). The tests run their own sshd inside a network
# namespace with a throwaway key and config; this script starts no service.
# Idempotent: when sshd, ssh and ssh-keygen are present it installs nothing (milliseconds).
# Without root or sudo it says so and exits 0, so a bootstrap as an ordinary user goes on
# (the multi-node tests then fail, naming what is missing).
set -euo pipefail

log() { printf '\033[1m[install_sshd]\033[0m %s\n' "$*"; }

if [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null 2>&1 \
   && command -v ssh-keygen >/dev/null 2>&1; then
  exit 0
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    log "not root and no sudo: skipping openssh-server (needed by tests/test_multinode.py)"
    exit 0
  fi
  SUDO=(sudo)
fi
log "installing openssh-server and openssh-client with apt-get (seconds)"
export DEBIAN_FRONTEND=noninteractive
if ! "${SUDO[@]}" apt-get install -y -qq --no-install-recommends openssh-server \
     openssh-client >/dev/null; then
  # a fresh container has no package lists; a stale one may name versions no longer served
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends openssh-server \
    openssh-client >/dev/null
fi
