#!/usr/bin/env bash
# A real Slurm (Debian's slurmctld, slurmd, munge) on the test cluster's hosts: slurmctld on this
# machine at the bridge's address, one slurmd inside each host's namespaces (network, UTS, mount:
# entered through that host's sshd), munge shared through the file system. Needs root and a
# cluster brought up with --etc-hosts (node names resolve everywhere).
#
# Usage: tests/cluster/slurm.sh up [-d CLUSTER_DIR] [-n N]   # N nodes h1..hN (default: all hosts)
#        tests/cluster/slurm.sh down [-d CLUSTER_DIR]
# After `up`: export SLURM_CONF=CLUSTER_DIR/slurm/slurm.conf, then salloc/srun/sbatch as usual.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
. "$here/lib.sh"

cmd=${1:-}; shift || true
dir="$MLT_DEFAULT_DIR" n=""
while [ $# -gt 0 ]; do
  case "$1" in
    -d) dir="$2"; shift 2 ;;
    -n) n="$2"; shift 2 ;;
    *) echo "slurm.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
sd="$dir/slurm"
conf="$sd/slurm.conf"
export SLURM_CONF="$conf"

stop_all() {
  local f
  for f in "$sd"/slurmd-*.pid "$sd/slurmctld.pid"; do
    [ -s "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  sleep 0.3
  for f in "$sd"/slurmd-*.pid "$sd/slurmctld.pid"; do
    [ -s "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  # Steps a killed slurmd left behind.
  pkill -KILL -f "slurmstepd: \[" 2>/dev/null || true
}

case "$cmd" in
  down)
    stop_all
    exit 0 ;;
  up) ;;
  *) echo "usage: $0 up|down [-d CLUSTER_DIR] [-n N]" >&2; exit 2 ;;
esac

mlt_need_root
for c in slurmctld slurmd munged srun; do
  command -v $c >/dev/null || mlt_die "$c not found (apt-get install slurmctld slurmd slurm-client munge)"
done
[ -n "$n" ] || n=$(ls -d "$dir"/h[0-9]* 2>/dev/null | wc -l)
[ "$n" -ge 1 ] || mlt_die "no cluster in $dir (tests/cluster/up.sh --etc-hosts first)"
getent hosts h1 >/dev/null || mlt_die "h1 does not resolve: bring the cluster up with --etc-hosts"
stop_all
rm -rf "$sd" && mkdir -p "$sd/state"

# munge: one key, one daemon; its socket is a file every namespace sees.
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
  chown munge: /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge: /run/munge /var/log/munge /var/lib/munge
if ! munge -n </dev/null >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 1 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
fi

ctl_host=$(hostname -s)
{
  echo "ClusterName=mltest"
  echo "SlurmctldHost=$ctl_host($MLT_GW)"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "StateSaveLocation=$sd/state"
  echo "SlurmdSpoolDir=$sd/spool-%n"
  echo "SlurmctldPidFile=$sd/slurmctld.pid"
  echo "SlurmdPidFile=$sd/slurmd-%n.pid"
  echo "SlurmctldLogFile=$sd/slurmctld.log"
  echo "SlurmdLogFile=$sd/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "MpiDefault=none"
  echo "SchedulerType=sched/builtin"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "ReturnToService=2"
  echo "SlurmdParameters=config_overrides"  # the nodes share this machine's 2 cores: take the CPUs as written
  echo "SlurmdTimeout=30"
  echo "KillWait=2"
  echo "MessageTimeout=20"
  echo "InactiveLimit=0"
  for k in $(seq 1 "$n"); do echo "NodeName=h$k NodeAddr=$(mlt_ip "$k") CPUs=8 RealMemory=1000 State=UNKNOWN"; done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
} >"$conf"

slurmctld -f "$conf" -i
for k in $(seq 1 "$n"); do
  pid=$(cat "$dir/h$k/sshd.pid") || mlt_die "h$k has no sshd (tests/cluster/up.sh first)"
  # In h$k's namespaces: its address, its host name, its /dev/shm and home. `ip netns exec`
  # gave it a fresh /sys without this machine's cgroup mounts, which slurmd wants to see.
  nsenter -t "$pid" -m -- /bin/sh -c '
    mountpoint -q /sys/fs/cgroup && exit 0
    mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup || exit 1
    for c in cpu cpuacct cpuset memory devices freezer pids; do
      mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c 2>/dev/null || rmdir /sys/fs/cgroup/$c
    done
    mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd' || mlt_die "cannot mount cgroups for h$k"
  nsenter -t "$pid" -n -u -m -- slurmd -f "$conf" -N "h$k"
done
for _ in $(seq 1 100); do
  idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l)
  [ "$idle" -ge "$n" ] && { echo "slurm: $n nodes idle (SLURM_CONF=$conf)"; exit 0; }
  sleep 0.2
done
sinfo -N >&2 || true
tail -5 "$sd/slurmctld.log" >&2 || true
mlt_die "slurm: the nodes did not come up within 20 s"
