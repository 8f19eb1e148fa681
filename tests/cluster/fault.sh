#!/usr/bin/env bash
# Fault injection on the test cluster made by up.sh. See README.md.
#
# Usage: tests/cluster/fault.sh [-d STATE_DIR] COMMAND hK
#   cut hK     silent network cut: every packet to/from hK vanishes (no FIN/RST/ICMP; peers hang)
#   heal hK    undo cut
#   kill hK    SIGKILL every process in hK's namespace (sshd, sessions, ranks): the host "dies"
#   revive hK  start hK's sshd again after kill (processes killed stay dead)
#   rekey hK   new sshd host key + sshd restart: clients see a CHANGED host key
#   forget hK  remove hK (alias and IP) from known_hosts: clients see an UNKNOWN host key
#   trust hK   put hK's current host key back into known_hosts (undoes forget and rekey)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

usage() { sed -n '4,12s/^# \{0,1\}//p' "$0" >&2; exit 2; }

dir="$MLT_DEFAULT_DIR"
while [ $# -gt 0 ]; do
  case "$1" in
    -d) [ $# -ge 2 ] || usage; dir="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) break ;;
  esac
done
[ $# = 2 ] || usage
cmd="$1"
k="$(mlt_host_index "$2")"
mlt_need_root
ns="$(mlt_ns "$k")" br="$(mlt_br "$k")"
ip netns list | awk '{print $1}' | grep -qx "$ns" || mlt_die "no host h$k (namespace $ns); is the cluster up?"
[ -d "$dir/h$k" ] || mlt_die "no state for h$k in $dir (wrong -d?)"
mlt_lock

case "$cmd" in
  cut)
    # Link down on the bridge side. Neighbour (ARP) entries are permanent on both sides (up.sh),
    # so nobody probes ARP, fails and reports "No route to host": packets just disappear.
    ip link set "$br" down ;;
  heal)
    ip link set "$br" up ;;
  kill)
    mlt_kill_ns "$ns"
    rm -f "$dir/h$k/sshd.pid" ;;
  revive)
    if [ -s "$dir/h$k/sshd.pid" ] && kill -0 "$(cat "$dir/h$k/sshd.pid")" 2>/dev/null; then
      echo "cluster: h$k's sshd is already running" >&2
    else
      mlt_start_sshd "$k" "$dir"
    fi
    mlt_wait_listening "$k" || mlt_die "h$k's sshd does not listen; log: $dir/h$k/sshd.log" ;;
  rekey)
    mlt_stop_sshd "$k" "$dir"
    rm -f "$dir/h$k/ssh_host_ed25519_key" "$dir/h$k/ssh_host_ed25519_key.pub"
    ssh-keygen -q -t ed25519 -N '' -C "mltrain-cluster-h$k" -f "$dir/h$k/ssh_host_ed25519_key"
    mlt_start_sshd "$k" "$dir"
    mlt_wait_listening "$k" || mlt_die "h$k's sshd does not listen after rekey; log: $dir/h$k/sshd.log" ;;
  forget)
    mlt_forget "$k" "$dir" ;;
  trust)
    mlt_forget "$k" "$dir"
    mlt_known_hosts_line "$k" "$dir" >>"$dir/known_hosts" ;;
  *) echo "fault.sh: unknown command '$cmd'" >&2; usage ;;
esac
