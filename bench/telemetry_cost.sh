#!/bin/bash
# What telemetry sampling costs a host: the CPU time of the host's agent while RANKS ranks sleep,
# sampling every second (MLTRAIN_TELEMETRY_INTERVAL=1s) against not sampling (=0), in interleaved
# rounds; with GPUS > 0 the agent reads that many fake GPUs (tests/fakes: the NVML calls a real
# sample makes, each GPU running one rank; the fake reads its config file on every call, so this
# bounds the sampler's own cost from above, not NVML's); GPUS=real: the host's own NVML. Prints each round's agent CPU as a share of one core
# and the medians; the difference is what sampling costs. Also the launcher's share (it writes
# telemetry.jsonl and telemetry-live.jsonl).
# Usage: bench/telemetry_cost.sh [ROUNDS=5] [SECONDS=10]   env: RANKS=8 GPUS=8 MLTRAIN_BIN
set -euo pipefail
cd "$(dirname "$0")/.."
ml=${MLTRAIN_BIN:-build/mltrain}
rounds=${1:-5} secs=${2:-10}
ranks=${RANKS:-8} gpus=${GPUS:-8}
export MLTRAIN_HOME=${MLTRAIN_HOME:-$(mktemp -d)}
fakes=$(dirname "$ml")/tests/fakes
env_gpu=()
if [ "$gpus" != real ] && [ "$gpus" -gt 0 ]; then
  [ -f "$fakes/libnvidia-ml.so.1" ] || { echo "build the fake_nvml target first ($fakes)" >&2; exit 1; }
  dir=$(mktemp -d)
  cp "$fakes/libnvidia-ml.so.1" "$dir/"
  echo "* gpus $gpus" >"$dir/fake-gpus.conf"
  echo "* util 70" >>"$dir/fake-gpus.conf"
  env_gpu=(--env "MLTRAIN_NVML_LIBRARY=$dir/libnvidia-ml.so.1")
fi

cpu_ns() { awk '{print $1}' "/proc/$1/schedstat"; }  # time on a CPU, ns

# One run: $1 = interval -> "agent_share launcher_share" (% of one core) over $secs seconds.
one() {
  local id launcher agent a0 a1 l0 l1 t0 t1
  id=$(MLTRAIN_TELEMETRY_INTERVAL=$1 "$ml" run -d -n "$ranks" "${env_gpu[@]}" -- \
    sh -c 'echo "$(hostname) pids.$LOCAL_RANK $$:100" >> '"${dir:-/dev/null}"'/fake-gpus.conf 2>/dev/null; exec sleep 600' 2>/dev/null)
  launcher=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['launcher_pid'])" \
    "$MLTRAIN_HOME/runs/$id/run.json")
  agent=$(pgrep -P "$launcher" | head -1)
  sleep 2  # past the start: ranks spawned, first samples taken
  a0=$(cpu_ns "$agent") l0=$(cpu_ns "$launcher") t0=$(date +%s%N)
  sleep "$secs"
  a1=$(cpu_ns "$agent") l1=$(cpu_ns "$launcher") t1=$(date +%s%N)
  "$ml" stop "$id" >/dev/null 2>&1 || true
  [ -n "${dir:-}" ] && sed -i '/pids\./d' "$dir/fake-gpus.conf"
  awk -v a=$((a1 - a0)) -v l=$((l1 - l0)) -v t=$((t1 - t0)) 'BEGIN {printf "%.3f %.3f", 100*a/t, 100*l/t}'
}

printf "# telemetry cost: %d ranks, %s GPUs (fake, or real: this host's NVML), on %s (%d cores), %d s per run, load %s\n" "$ranks" "$gpus" \
  "$(hostname)" "$(nproc)" "$secs" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf "# share of one core (%%): the agent, and the launcher\n"
printf "%6s %14s %14s %16s %16s\n" round "agent off" "agent 1s" "launcher off" "launcher 1s"
off_a=() on_a=() off_l=() on_l=()
for r in $(seq "$rounds"); do
  read -r a l <<<"$(one 0)"
  read -r b m <<<"$(one 1s)"
  off_a+=("$a") on_a+=("$b") off_l+=("$l") on_l+=("$m")
  printf "%6d %14s %14s %16s %16s\n" "$r" "$a" "$b" "$l" "$m"
done
median() { printf "%s\n" "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
ma=$(median "${off_a[@]}") mb=$(median "${on_a[@]}") ml_=$(median "${off_l[@]}") mm=$(median "${on_l[@]}")
printf "%6s %14s %14s %16s %16s\n" median "$ma" "$mb" "$ml_" "$mm"
awk -v a="$ma" -v b="$mb" 'BEGIN {printf "sampling every 1 s costs the agent %.3f%% of one core (budget: 1%%)\n", b - a}'
