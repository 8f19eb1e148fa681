#!/usr/bin/env bash
# Bring up the test cluster: N "hosts" as network namespaces on bridge mltbr0, each running its own
# sshd on 10.231.0.(10+K):22. Tears down a previous cluster first. Needs root. See README.md.
#
# Usage: tests/cluster/up.sh [-n N] [-d STATE_DIR] [--max-sessions hK=M]... [--hostname hK=NAME]... [--etc-hosts]
#                           [--user NAME] [--private-homes] [--reuse]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

usage() {
  echo "usage: $0 [-n N] [-d STATE_DIR] [--max-sessions hK=M]... [--hostname hK=NAME]... [--etc-hosts] [--user NAME] [--private-homes] [--reuse]" >&2
  echo "  -n N                 number of hosts (default 4, at most 200)" >&2
  echo "  -d STATE_DIR         keys, configs, logs (default $MLT_DEFAULT_DIR)" >&2
  echo "  --max-sessions hK=M  sshd MaxSessions M on host hK (default 10); repeatable" >&2
  echo "  --hostname hK=NAME   host hK's own name (\`hostname\`) is NAME, e.g. two hosts both 'ubuntu'; repeatable" >&2
  echo "  --etc-hosts          also add 'IP hK' lines to /etc/hosts (down.sh removes them)" >&2
  echo "  --user NAME          the user ssh logs in as (default mltest, created with /bin/sh as its shell)" >&2
  echo "  --private-homes      every host has a home folder of its own (STATE_DIR/hK/home, empty at first)," >&2
  echo "                       so the hosts share no files there, as separate machines do" >&2
  echo "  --reuse              keep the bridge, namespaces and keys of a cluster that is up with at least N hosts:" >&2
  echo "                       kill every process on every host and start each sshd afresh with these settings" >&2
  echo "                       (a fresh cluster in all a test sees, without the teardown; a full bring-up otherwise)" >&2
  exit 2
}

n=4
dir="$MLT_DEFAULT_DIR"
etc_hosts=0
private_homes=0
reuse=0
user=mltest
declare -A max_sessions=()
declare -A host_names=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) [ $# -ge 2 ] || usage; n="$2"; shift 2 ;;
    -d) [ $# -ge 2 ] || usage; dir="$2"; shift 2 ;;
    --max-sessions) [ $# -ge 2 ] || usage; ms="$2"; shift 2
      [[ "$ms" =~ ^h?[0-9]+=[0-9]+$ ]] || mlt_die "bad --max-sessions '$ms' (want hK=M)"
      max_sessions[$(mlt_host_index "${ms%%=*}")]="${ms#*=}" ;;
    --max-sessions=*) ms="${1#*=}"; shift
      [[ "$ms" =~ ^h?[0-9]+=[0-9]+$ ]] || mlt_die "bad --max-sessions '$ms' (want hK=M)"
      max_sessions[$(mlt_host_index "${ms%%=*}")]="${ms#*=}" ;;
    --hostname) [ $# -ge 2 ] || usage; hn="$2"; shift 2
      [[ "$hn" =~ ^h?[0-9]+=[A-Za-z0-9][A-Za-z0-9.-]*$ ]] || mlt_die "bad --hostname '$hn' (want hK=NAME)"
      host_names[$(mlt_host_index "${hn%%=*}")]="${hn#*=}" ;;
    --etc-hosts) etc_hosts=1; shift ;;
    --user) [ $# -ge 2 ] || usage; user="$2"; shift 2 ;;
    --private-homes) private_homes=1; shift ;;
    --reuse) reuse=1; shift ;;
    -h|--help) usage ;;
    *) echo "up.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 && "$n" -le 200 ]] || mlt_die "bad -n '$n' (1..200)"
for k in "${!max_sessions[@]}"; do
  [ "$k" -le "$n" ] || mlt_die "--max-sessions names h$k but the cluster has $n hosts"
done
for k in "${!host_names[@]}"; do
  [ "$k" -le "$n" ] || mlt_die "--hostname names h$k but the cluster has $n hosts"
done
mlt_need_root
# The hosts log in a plain user whose shell is /bin/sh, as on a minimal node: root's login shell
# here runs a slow ~/.bashrc (pyenv) on every ssh command, which would swamp launch timings.
if [ "$user" != root ] && ! id "$user" >/dev/null 2>&1; then
  # "*": no password, yet not locked (sshd without PAM refuses locked accounts even with a key).
  useradd --create-home --shell /bin/sh --password "*" "$user" || mlt_die "cannot create the test user '$user'"
fi
command -v ssh-keygen >/dev/null || mlt_die "ssh-keygen not found (apt-get install openssh-client)"
for c in ssh sftp; do command -v $c >/dev/null || mlt_die "$c not found (apt-get install openssh-client)"; done
case "$dir" in /*) ;; *) dir="$(pwd)/$dir" ;; esac

t0=$(date +%s.%N)
trace() { [ -z "${MLT_CLUSTER_TRACE:-}" ] || awk -v a="$t0" -v b="$(date +%s.%N)" -v m="$*" 'BEGIN{printf "cluster: %6.2f s %s\n", b-a, m}' >&2; }
# A new cluster: the state dir, the keys, the bridge and one namespace per host.
fresh_cluster() {
  mkdir -p "$dir"
  chmod 711 "$dir"  # the test user reads authorized_keys; the private key stays 600
  rm -rf "${dir:?}"/h[0-9]* "$dir"/{id_ed25519,id_ed25519.pub,authorized_keys,known_hosts,ssh_config,hostfile,env.sh}

  # Keys: the client key and every host key, generated in parallel.
  ssh-keygen -q -t ed25519 -N '' -C "mltrain-cluster-client" -f "$dir/id_ed25519" &
  for k in $(seq 1 "$n"); do
    mkdir -p "$dir/h$k"
    ssh-keygen -q -t ed25519 -N '' -C "mltrain-cluster-h$k" -f "$dir/h$k/ssh_host_ed25519_key" &
  done
  wait
  trace keys
  cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
  chmod 644 "$dir/authorized_keys"

  # Network: the bridge in the root namespace (the launcher runs there), one veth per host.
  # Permanent neighbour (ARP) entries everywhere: with no ARP on the wire, a cut host (fault.sh cut)
  # is silent (packets vanish) instead of failing fast with "No route to host" when ARP times out.
  # Batched: one `ip` for the root namespace, one per host namespace.
  {
    echo "link add $MLT_BRIDGE type bridge stp_state 0 forward_delay 0"
    echo "link set $MLT_BRIDGE address $MLT_BRIDGE_MAC"
    echo "addr add $MLT_GW/24 dev $MLT_BRIDGE"
    echo "link set $MLT_BRIDGE up"
    for k in $(seq 1 "$n"); do
      echo "netns add $(mlt_ns "$k")"
      echo "link add $(mlt_br "$k") type veth peer name eth0 netns $(mlt_ns "$k")"
      echo "link set $(mlt_br "$k") master $MLT_BRIDGE"
      echo "link set $(mlt_br "$k") up"
      echo "neigh replace $(mlt_ip "$k") lladdr $(mlt_mac "$k") dev $MLT_BRIDGE nud permanent"
    done
  } | ip -batch - || mlt_die "network setup failed in the root namespace"
  for k in $(seq 1 "$n"); do
    {
      echo "link set lo up"
      echo "link set eth0 address $(mlt_mac "$k")"
      echo "addr add $(mlt_ip "$k")/24 dev eth0"
      echo "link set eth0 up"
      echo "route add default via $MLT_GW"
      echo "neigh replace $MLT_GW lladdr $MLT_BRIDGE_MAC dev eth0 nud permanent"
      for j in $(seq 1 "$n"); do
        [ "$j" = "$k" ] || echo "neigh replace $(mlt_ip "$j") lladdr $(mlt_mac "$j") dev eth0 nud permanent"
      done
    } | ip -n "$(mlt_ns "$k")" -batch - || mlt_die "network setup failed in $(mlt_ns "$k")"
  done

  trace network
}

mlt_lock

# --reuse: a cluster already up here with at least n hosts, made by up.sh in this state dir.
reusable() {
  local k
  [ "$reuse" = 1 ] && ip link show "$MLT_BRIDGE" >/dev/null 2>&1 && [ -s "$dir/id_ed25519" ] || return 1
  for k in $(seq 1 "$n"); do
    ip netns list | awk '{print $1}' | grep -qx "$(mlt_ns "$k")" && [ -s "$dir/h$k/ssh_host_ed25519_key" ] || return 1
  done
}
if reusable; then
  # What a teardown would do to the hosts, keeping the network and the keys: the cluster's Slurm
  # stopped, every process on every host killed, every cut link healed, /etc/hosts cleaned.
  if [ -d "$dir/slurm" ]; then "$here/slurm.sh" down -d "$dir" || mlt_die "cannot stop the cluster's Slurm"; fi
  namespaces=()
  for k in $(mlt_existing_hosts); do
    namespaces+=("$(mlt_ns "$k")")
    ip link set "$(mlt_br "$k")" up 2>/dev/null || true
    rm -f "$dir/h$k/sshd.pid"
  done
  mlt_kill_ns "${namespaces[@]}" || mlt_die "cannot stop the processes on the hosts"
  mlt_etc_hosts_remove
  trace "reused: hosts reset"
else
  "$here/down.sh" -d "$dir" >/dev/null
  trace down
  fresh_cluster
fi

# Client side files: known_hosts, ssh_config, hostfile, env.sh.
: >"$dir/known_hosts"
: >"$dir/ssh_config"
: >"$dir/hostfile"
hosts=""
for k in $(seq 1 "$n"); do
  mlt_known_hosts_line "$k" "$dir" >>"$dir/known_hosts"
  cat >>"$dir/ssh_config" <<EOF
Host h$k
  HostName $(mlt_ip "$k")
  User $user
  Port 22
  IdentityFile $dir/id_ed25519
  UserKnownHostsFile $dir/known_hosts
  StrictHostKeyChecking yes
  IdentitiesOnly yes
  ConnectTimeout 5

EOF
  echo "h$k slots=4" >>"$dir/hostfile"
  hosts="${hosts:+$hosts }h$k"
done
cat >"$dir/env.sh" <<EOF
# Written by tests/cluster/up.sh; source it.
export MLTRAIN_CLUSTER_DIR='$dir'
export MLTRAIN_CLUSTER_HOSTS='$hosts'
export MLTRAIN_CLUSTER_SSH_CONFIG='$dir/ssh_config'
export MLTRAIN_CLUSTER_KNOWN_HOSTS='$dir/known_hosts'
export MLTRAIN_CLUSTER_HOSTFILE='$dir/hostfile'
EOF
if [ "$etc_hosts" = 1 ]; then
  {
    echo "$MLT_HOSTS_BEGIN"
    for k in $(seq 1 "$n"); do echo "$(mlt_ip "$k") h$k"; done
    echo "$MLT_HOSTS_END"
  } >>/etc/hosts
fi

trace client files
# One sshd per host, inside its namespace.
for k in $(seq 1 "$n"); do
  hd="$dir/h$k"
  cat >"$hd/sshd_config" <<EOF
# Written by tests/cluster/up.sh for host h$k (namespace $(mlt_ns "$k")).
ListenAddress $(mlt_ip "$k"):22
Port 22
HostKey $hd/ssh_host_ed25519_key
PidFile $hd/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile $dir/authorized_keys
StrictModes no
UsePAM no
MaxSessions ${max_sessions[$k]:-10}
LogLevel ERROR
PrintMotd no
PrintLastLog no
X11Forwarding no
UseDNS no
Subsystem sftp internal-sftp
EOF
  : >"$hd/sshd.log"
  if [ -n "${host_names[$k]:-}" ]; then echo "${host_names[$k]}" >"$hd/hostname"; else rm -f "$hd/hostname"; fi
  rm -rf "$hd/home" "$hd/home_of"
  if [ "$private_homes" = 1 ]; then
    # mlt_start_sshd mounts it over the user's home inside the host's mount namespace.
    mkdir -p "$hd/home" && chown "$user:" "$hd/home" && chmod 755 "$hd/home"
    getent passwd "$user" | cut -d: -f6 >"$hd/home_of"
  fi
done
mkdir -p /run/sshd && chmod 755 /run/sshd   # sshd's privilege separation directory
starters=()
for k in $(seq 1 "$n"); do
  ( mlt_start_sshd "$k" "$dir" ) &
  starters+=("$!")
done
started=1
for p in "${starters[@]}"; do wait "$p" || started=0; done
[ "$started" = 1 ] || mlt_die "bring-up failed: an sshd did not start (see above; tests/cluster/down.sh cleans up)"

trace sshd started
# Wait until every sshd answers: first that it listens (cheap), then a login with the client files.
# The login is an sftp session with no commands (sshd's internal-sftp): it proves the keys,
# known_hosts and ssh_config work without paying for a login shell (root's ~/.bashrc can be slow).
probe() {
  timeout 30 sftp -F "$dir/ssh_config" -o BatchMode=yes -o ConnectTimeout=10 -b /dev/null "h$1" \
    </dev/null >/dev/null 2>"$dir/h$1/probe.err"
}
for k in $(seq 1 "$n"); do
  (
    mlt_wait_listening "$k" || true
    for _ in 1 2 3; do probe "$k" && exit 0; sleep 0.5; done
    exit 1
  ) &
done
ok=1
for k in $(seq 1 "$n"); do
  wait -n || ok=0
done
if [ "$ok" != 1 ]; then
  for k in $(seq 1 "$n"); do
    if ! probe "$k"; then
      echo "cluster: h$k ($(mlt_ip "$k")) does not answer ssh. ssh said:" >&2
      sed 's/^/  /' "$dir/h$k/probe.err" >&2
      echo "  sshd log ($dir/h$k/sshd.log):" >&2
      sed 's/^/  /' "$dir/h$k/sshd.log" >&2
    fi
  done
  mlt_die "bring-up failed (the cluster is left up for inspection; tests/cluster/down.sh removes it)"
fi
trace ssh answers
rm -f "$dir"/h[0-9]*/probe.err

t1=$(date +%s.%N)
printf 'cluster: %d hosts up in %.1f s (%s); source %s/env.sh\n' \
  "$n" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" "$hosts" "$dir" >&2
