#!/usr/bin/env bash
# Tear down the test cluster: kill every process in every mlt-hK namespace, delete the namespaces,
# the veths and the bridge, and the /etc/hosts block of up.sh --etc-hosts. Idempotent; safe when nothing is up. See README.md.
#
# Usage: tests/cluster/down.sh [-d STATE_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

dir="$MLT_DEFAULT_DIR"
while [ $# -gt 0 ]; do
  case "$1" in
    -d) [ $# -ge 2 ] || { echo "usage: $0 [-d STATE_DIR]" >&2; exit 2; }; dir="$2"; shift 2 ;;
    -h|--help) echo "usage: $0 [-d STATE_DIR]" >&2; exit 2 ;;
    *) echo "down.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mlt_need_root
mlt_lock

status=0
# A Slurm started on the cluster (slurm.sh): its controller runs here, outside the namespaces.
if [ -d "$dir/slurm" ]; then "$here/slurm.sh" down -d "$dir" || status=1; fi
namespaces=()
for k in $(mlt_existing_hosts); do namespaces+=("$(mlt_ns "$k")"); done
if [ "${#namespaces[@]}" -gt 0 ]; then
  mlt_kill_ns "${namespaces[@]}" || status=1
  for ns in "${namespaces[@]}"; do
    ip netns delete "$ns" 2>/dev/null || { echo "cluster: cannot delete namespace $ns" >&2; status=1; }
  done
fi
# sshds recorded in the state dir whose namespace was already deleted under them.
for pf in "$dir"/h[0-9]*/sshd.pid; do
  [ -s "$pf" ] || continue
  pid="$(cat "$pf")"
  if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "sshd"; then
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
  fi
  rm -f "$pf"
done
# Bridge-side veths whose namespace is gone already vanish with it; delete any leftovers.
for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^mlt-h[0-9]+-br$' || true); do
  ip link delete "$l" 2>/dev/null || true
done
mlt_etc_hosts_remove || status=1
if ip link show "$MLT_BRIDGE" >/dev/null 2>&1; then
  ip link delete "$MLT_BRIDGE" || status=1
fi
exit "$status"
