# shellcheck shell=bash disable=SC2034
# Shared by up.sh, down.sh and fault.sh (sourced, not run). See README.md.
# One cluster per machine: the bridge and namespace names are fixed.

MLT_BRIDGE=mltbr0
MLT_NET=10.231.0
MLT_GW="$MLT_NET.1"
MLT_BRIDGE_MAC=02:00:0a:e7:00:01
MLT_LOCK=/run/lock/mltrain-cluster.lock
MLT_DEFAULT_DIR="${MLTRAIN_CLUSTER_DIR:-/tmp/mltrain-cluster}"

MLT_HOSTS_BEGIN="# mltrain-cluster begin (tests/cluster/up.sh --etc-hosts)"
MLT_HOSTS_END="# mltrain-cluster end"

mlt_die() { echo "cluster: $*" >&2; exit 1; }

mlt_ns()  { echo "mlt-h$1"; }                  # namespace of host K
mlt_br()  { echo "mlt-h$1-br"; }               # bridge-side veth of host K
mlt_ip()  { echo "$MLT_NET.$((10 + $1))"; }    # address of host K
mlt_mac() { printf '02:00:0a:e7:00:%02x\n' $((10 + $1)); }

# "h3" or "3" -> 3; dies on anything else.
mlt_host_index() {
  local h="${1#h}"
  [[ "$h" =~ ^[0-9]+$ && "$h" -ge 1 && "$h" -le 200 ]] || mlt_die "bad host '$1' (want hK, e.g. h2)"
  echo "$((10#$h))"
}

mlt_need_root() {
  [ "$(id -u)" = 0 ] || mlt_die "must run as root (network namespaces, sshd on port 22)"
  command -v ip >/dev/null || mlt_die "ip (iproute2) not found"
  [ -x /usr/sbin/sshd ] || mlt_die "/usr/sbin/sshd not found (apt-get install openssh-server)"
}

# Serialize up/down/fault between concurrent callers; nested calls (MLT_LOCKED=1) skip it.
mlt_lock() {
  [ "${MLT_LOCKED:-}" = 1 ] && return 0
  mkdir -p "$(dirname "$MLT_LOCK")"
  exec 9>"$MLT_LOCK"
  flock -w 120 9 || mlt_die "timed out waiting for $MLT_LOCK"
  export MLT_LOCKED=1
}

# Indices of the namespaces that exist now (mlt-hK), one per line.
mlt_existing_hosts() {
  ip netns list 2>/dev/null | awk '{print $1}' | sed -n 's/^mlt-h\([0-9][0-9]*\)$/\1/p' | sort -n
}

# SIGKILL every process in the namespaces given and wait (bounded) until none is left, then give
# their parents (often pid 1) up to 3 s to reap them, so `pgrep sshd` right after shows nothing.
mlt_kill_ns() {
  local pids="" ns i p all="" left="" _
  for i in $(seq 1 50); do
    pids=""
    for ns in "$@"; do pids="$pids $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"; done
    if [ -z "${pids// /}" ]; then
      for _ in $(seq 1 30); do
        left=""
        for p in $all; do [ -e "/proc/$p" ] && { left=1; break; }; done
        [ -z "$left" ] && return 0
        sleep 0.1
      done
      return 0
    fi
    all="$all $pids"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.05
  done
  echo "cluster: processes still alive in $* after 2.5 s:$pids" >&2
  return 1
}

# Start host K's sshd (already configured under $DIR/hK) and wait until it listens.
mlt_start_sshd() {
  local k="$1" dir="$2" hd="$2/h$1" i
  mkdir -p /run/sshd && chmod 755 /run/sshd
  rm -f "$hd/sshd.pid"
  # Own UTS namespace too, so `hostname` on host K says hK (or the name in $hd/hostname, which
  # up.sh --hostname writes); own mount namespace with a private tmpfs on /dev/shm, so hosts share
  # no memory, as separate machines do (the comm library picks shared memory by /dev/shm's identity).
  local name="h$k"
  [ -s "$hd/hostname" ] && name="$(cat "$hd/hostname")"
  # shellcheck disable=SC2016
  # With up.sh --private-homes, the login user's home is $hd/home there (no files shared).
  ip netns exec "$(mlt_ns "$k")" unshare --uts --mount --propagation private /bin/sh -c \
      'hostname "$1" && mount -t tmpfs -o mode=1777,size=512m "mlt-shm-$3" /dev/shm &&
       { [ ! -s "$2/home_of" ] || mount --bind "$2/home" "$(cat "$2/home_of")"; } &&
       exec /usr/sbin/sshd -f "$2/sshd_config" -E "$2/sshd.log"' _ "$name" "$hd" "h$k" \
    || { cat "$hd/sshd.log" >&2 2>/dev/null; mlt_die "sshd for h$k failed to start"; }
  for i in $(seq 1 50); do
    [ -s "$hd/sshd.pid" ] && return 0
    sleep 0.1
  done
  cat "$hd/sshd.log" >&2 2>/dev/null
  mlt_die "sshd for h$k wrote no pid file within 5 s"
}

# Stop host K's listening sshd (by its pid file); sessions it forked are left alone.
mlt_stop_sshd() {
  local hd="$2/h$1" pid i
  [ -s "$hd/sshd.pid" ] || return 0
  pid="$(cat "$hd/sshd.pid")"
  kill -TERM "$pid" 2>/dev/null || { rm -f "$hd/sshd.pid"; return 0; }
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$hd/sshd.pid"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$hd/sshd.pid"
}

# known_hosts line for host K: the alias and the IP, plain (not hashed).
mlt_known_hosts_line() {
  local k="$1" dir="$2"
  echo "h$k,$(mlt_ip "$k") $(cut -d' ' -f1,2 "$dir/h$k/ssh_host_ed25519_key.pub")"
}

# Remove host K (alias and IP) from known_hosts.
mlt_forget() {
  local k="$1" dir="$2" kh="$2/known_hosts"
  [ -f "$kh" ] || return 0
  awk -v a="h$k" -v ip="$(mlt_ip "$k")" '{
      n = split($1, names, ","); keep = 1
      for (i = 1; i <= n; i++) if (names[i] == a || names[i] == ip || names[i] == "[" ip "]:22") keep = 0
      if (keep) print
    }' "$kh" >"$kh.tmp" && mv -f "$kh.tmp" "$kh"
}

# Wait (at most ~10 s) until host K's sshd listens on port 22. Checked with ss inside the namespace,
# not by connecting: a probe connection would leave "Connection reset" noise in sshd.log.
mlt_wait_listening() {
  local ns i
  ns="$(mlt_ns "$1")"
  for i in $(seq 1 100); do
    [ -n "$(ip netns exec "$ns" ss -Hltn "sport = :22" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  return 1
}

# Remove the block up.sh --etc-hosts added to /etc/hosts (in place: /etc/hosts may be a mount).
mlt_etc_hosts_remove() {
  grep -qxF "$MLT_HOSTS_BEGIN" /etc/hosts 2>/dev/null || return 0
  local tmp
  tmp="$(awk -v b="$MLT_HOSTS_BEGIN" -v e="$MLT_HOSTS_END" \
    '$0 == b {skip = 1; next} skip && $0 == e {skip = 0; next} !skip' /etc/hosts)"
  printf '%s\n' "$tmp" >/etc/hosts
}
