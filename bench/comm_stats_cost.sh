#!/bin/bash
# What the comm library's per-rank counters (mltrain/comm_stats.h, read by `mltrain top`) cost at
# 4 KiB, two ways, in interleaved rounds (each round runs all three, medians at the end):
#   ratio: a 4 KiB allreduce on N ranks of this host through `mltrain bench` (median time per
#          call) with MLTRAIN_COMM_STATS=1 against =0. Honest but blunt: runs differ by 1-2%.
#   cost:  the counters' own work per call, measured on the real call path by
#          bench/comm_stats_cost.cpp (one-rank allreduces with and without counters, 101
#          alternating sub-rounds), as a share of that round's stats=0 allreduce time.
# Usage: bench/comm_stats_cost.sh [RANKS=2] [ROUNDS=7] [ITERS=20000]
#   MLTRAIN_BIN: the binary (default build/mltrain); its folder's comm/libmltrain-comm.so is the
#   library the cost is measured on (cmake --build BUILD --target mltrain builds both).
set -euo pipefail
cd "$(dirname "$0")/.."
ml=${MLTRAIN_BIN:-build/mltrain}
build=$(cd "$(dirname "$ml")" && pwd)
ranks=${1:-2} rounds=${2:-7} iters=${3:-20000}
[[ -x $ml && -e $build/comm/libmltrain-comm.so ]] ||
  { echo "comm_stats_cost.sh: no $ml or $build/comm/libmltrain-comm.so (cmake --build $build --target mltrain)" >&2; exit 2; }
export MLTRAIN_HOME=${MLTRAIN_HOME:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
${CXX:-c++} -O2 -std=c++20 -Icomm/include bench/comm_stats_cost.cpp -o "$work/comm_stats_cost" \
  -L"$build/comm" -lmltrain-comm -Wl,-rpath,"$build/comm"

one() {  # $1 = 0|1 -> median us per call at 4 KiB
  MLTRAIN_COMM_STATS="$1" "$ml" bench -n "$ranks" -b 4K -e 4K --iters "$iters" --warmup 500 --stat median \
    2>/dev/null | awk '!/^#/ && NF >= 8 && $1 ~ /^[0-9]+$/ {print $5}'
}
cost() {  # -> ns per call the counters add (median of the sub-rounds); the clock line on fd 3
  "$work/comm_stats_cost" 101 20000 >"$work/cost.txt" || { cat "$work/cost.txt" >&2; exit 1; }
  sed -n 's/^# .*clock: //p' "$work/cost.txt" >"$work/clock.txt"
  awk '!/^#/ && $3 ~ /^-?[0-9.]+$/ {print $3}' "$work/cost.txt"
}
div() { awk -v a="$1" -v b="$2" -v s="$3" -v f="$4" 'BEGIN {printf f, s * a / b}'; }
median() { printf "%s\n" "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

off=() on=() ratio=() ns=() share=()
printf "# 4 KiB allreduce f32, %d ranks on %s (%d cores), %d calls per run, load %s\n" "$ranks" "$(hostname)" \
  "$(nproc)" "$iters" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf "%6s %12s %12s %8s %14s %16s\n" round "stats=0 us" "stats=1 us" ratio "counters ns" "ns/allreduce %"
for r in $(seq "$rounds"); do
  a=$(one 0) b=$(one 1) c=$(cost)
  [[ -n $a && -n $b && -n $c ]] || { echo "comm_stats_cost.sh: a run printed no time" >&2; exit 1; }
  off+=("$a") on+=("$b") ns+=("$c")
  ratio+=("$(div "$b" "$a" 1 %.4f)") share+=("$(div "$c" "$a" 0.1 %.3f)")  # ns / (us * 1000) * 100
  printf "%6d %12s %12s %8s %14s %16s\n" "$r" "$a" "$b" "${ratio[-1]}" "$c" "${share[-1]}"
done
printf "%6s %12s %12s %8s %14s %16s\n" median "$(median "${off[@]}")" "$(median "${on[@]}")" \
  "$(median "${ratio[@]}")" "$(median "${ns[@]}")" "$(median "${share[@]}")"
printf "# ratio: stats=1/stats=0 time of that round (1.000: free; runs differ by 1-2%%, so read the median)\n"
printf "# counters ns: stats=1 - stats=0 per one-rank call (the counters' own work; clock: %s)\n" \
  "$(cat "$work/clock.txt")"
printf "# ns/allreduce %%: counters ns / that round's stats=0 time per %d-rank call (must stay under 1%%)\n" "$ranks"
