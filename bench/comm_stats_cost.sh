#!/bin/bash
# What the comm library's per-rank counters (mltrain/comm_stats.h, read by `mltrain top`) cost:
# 4 KiB allreduce on N ranks of this host with MLTRAIN_COMM_STATS=1 against =0, in interleaved
# rounds; prints each round's median time per call and the ratio of the medians.
# Usage: bench/comm_stats_cost.sh [RANKS=2] [ROUNDS=7] [ITERS=5000]   (MLTRAIN_BIN: the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
ml=${MLTRAIN_BIN:-build/mltrain}
ranks=${1:-2} rounds=${2:-7} iters=${3:-5000}
export MLTRAIN_HOME=${MLTRAIN_HOME:-$(mktemp -d)}
one() {  # $1 = 0|1 -> median us per call at 4 KiB
  MLTRAIN_COMM_STATS="$1" "$ml" bench -n "$ranks" -b 4K -e 4K --iters "$iters" --warmup 500 --stat median \
    2>/dev/null | awk '!/^#/ && NF >= 8 && $1 ~ /^[0-9]+$/ {print $5}'
}
on=() off=()
printf "# 4 KiB allreduce f32, %d ranks on %s (%d cores), %d calls per run, load %s\n" "$ranks" "$(hostname)" \
  "$(nproc)" "$iters" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf "%6s %12s %12s\n" round "stats=0 us" "stats=1 us"
for r in $(seq "$rounds"); do
  a=$(one 0) b=$(one 1)
  off+=("$a") on+=("$b")
  printf "%6d %12s %12s\n" "$r" "$a" "$b"
done
median() { printf "%s\n" "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
m0=$(median "${off[@]}") m1=$(median "${on[@]}")
printf "median %12s %12s   ratio stats=1/stats=0: %s\n" "$m0" "$m1" "$(awk -v a="$m1" -v b="$m0" 'BEGIN {printf "%.3f", a/b}')"
