#!/usr/bin/env bash
# Two "hosts" on one machine, for rehearsing multi-node runs: two network namespaces joined
# by a veth pair, each end with its own address, so torchrun, gloo and horovodrun (over
# ssh) cross a real network link that a test can cut (`ip -n NS link set IFACE down`).
#
#   scripts/netns_hosts.sh up   [PREFIX]   # create PREFIX-h0 (10.77.0.1) and PREFIX-h1 (10.77.0.2)
#   scripts/netns_hosts.sh down [PREFIX]   # kill every process left inside them, delete them
#   scripts/netns_hosts.sh env  [PREFIX]   # print NS0= NS1= ADDR0= ADDR1= IFACE= (shell syntax)
#
# PREFIX (default "pb", letters/digits/dashes, at most 12 characters) keeps parallel runs
# apart: each gets its own pair of namespaces. Both veth ends carry the same interface name
# (IFACE, default pbnet0) inside their namespaces, as `eth0` would on two real machines:
# horovodrun's --network-interface and GLOO_SOCKET_IFNAME name one interface for every host.
# NETNS_SUBNET (default 10.77.0) and NETNS_IFACE override the addresses and the name.
# Each namespace also gets its own /etc/hosts (/etc/netns/NS/hosts, which `ip netns exec`
# mounts over /etc/hosts): the two namespace names, and this machine's host name mapped to
# that namespace's address, as on a real machine. Horovod 0.28.1 needs the latter: its
# process-set gloo context binds to the address of the host name, not of
# --network-interface, and the machine's own /etc/hosts maps the name to 127.0.0.1.
# `up` and `down` are idempotent: `up` on healthy namespaces does nothing, on half-made ones
# it rebuilds them; `down` on missing ones does nothing. Needs root and iproute2's `ip`.
set -euo pipefail

cmd=${1:-}
PREFIX=${2:-pb}
SUBNET=${NETNS_SUBNET:-10.77.0}
IFACE=${NETNS_IFACE:-pbnet0}
NS0="$PREFIX-h0"
NS1="$PREFIX-h1"
ADDR0="$SUBNET.1"
ADDR1="$SUBNET.2"

die() { echo "netns_hosts.sh: $*" >&2; exit 1; }

usage() { die "usage: netns_hosts.sh up|down|env [PREFIX]"; }

check_prefix() {
  [[ "$PREFIX" =~ ^[A-Za-z0-9][A-Za-z0-9-]{0,11}$ ]] \
    || die "prefix '$PREFIX' must be 1-12 letters, digits or dashes"
}

check_tools() {
  [ "$(id -u)" -eq 0 ] || die "network namespaces need root (run as root or with sudo)"
  command -v ip >/dev/null 2>&1 || die "'ip' not found: apt-get install iproute2"
}

ns_exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }

healthy() {
  ns_exists "$NS0" && ns_exists "$NS1" \
    && [ -f "/etc/netns/$NS0/hosts" ] && [ -f "/etc/netns/$NS1/hosts" ] \
    && ip -n "$NS0" -4 -o addr show dev "$IFACE" 2>/dev/null | grep -q " $ADDR0/" \
    && ip -n "$NS1" -4 -o addr show dev "$IFACE" 2>/dev/null | grep -q " $ADDR1/" \
    && ip -n "$NS0" -o link show dev "$IFACE" | grep -q "state UP" \
    && ip -n "$NS1" -o link show dev "$IFACE" | grep -q "state UP"
}

kill_inside() {  # SIGKILL every process whose network namespace is $1, wait (5 s) for them
  local ns=$1 pids
  for _ in $(seq 50); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086 # one pid per word
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  die "processes still alive in $ns after SIGKILL: $(ip netns pids "$ns" | tr '\n' ' ')"
}

down() {
  for ns in "$NS0" "$NS1"; do
    if ns_exists "$ns"; then
      kill_inside "$ns"
      ip netns del "$ns"  # deletes its veth end, and with it the pair
    fi
    rm -rf "/etc/netns/$ns"
  done
}

hosts_file() {  # $1: namespace, $2: its address
  mkdir -p "/etc/netns/$1"
  printf '127.0.0.1 localhost\n%s %s\n%s %s\n%s %s\n' "$2" "$(hostname)" \
    "$ADDR0" "$NS0" "$ADDR1" "$NS1" > "/etc/netns/$1/hosts"
}

up() {
  if healthy; then
    return 0
  fi
  down  # half-made (or a cut link): start over
  ip netns add "$NS0"
  ip netns add "$NS1"
  # created straight inside the namespaces, so the shared name never meets itself
  ip link add "$IFACE" netns "$NS0" type veth peer name "$IFACE" netns "$NS1"
  ip -n "$NS0" addr add "$ADDR0/24" dev "$IFACE"
  ip -n "$NS1" addr add "$ADDR1/24" dev "$IFACE"
  hosts_file "$NS0" "$ADDR0"
  hosts_file "$NS1" "$ADDR1"
  for ns in "$NS0" "$NS1"; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$IFACE" up
  done
  for _ in $(seq 50); do  # veth carrier comes up asynchronously
    healthy && return 0
    sleep 0.1
  done
  die "namespaces $NS0/$NS1 created but $IFACE did not come up"
}

case "$cmd" in
  up) check_prefix; check_tools; up
      echo "netns_hosts.sh: $NS0 ($ADDR0) <-> $NS1 ($ADDR1) over $IFACE" ;;
  down) check_prefix; check_tools; down ;;
  env) check_prefix
       printf 'NS0=%s\nNS1=%s\nADDR0=%s\nADDR1=%s\nIFACE=%s\n' \
         "$NS0" "$NS1" "$ADDR0" "$ADDR1" "$IFACE" ;;
  *) usage ;;
esac
