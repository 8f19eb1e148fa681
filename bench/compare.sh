#!/usr/bin/env bash
# bench/compare.sh: allreduce (f32, sum) of mltrain-comm-bench beside Gloo's allreduce
# algorithms (Gloo TCP transport) and Open MPI MPI_Allreduce over TCP (--mca btl tcp,self), for
# the same ranks and sizes on this host. Prints one table: median time per call, busbw
# (algbw * 2(n-1)/n, as nccl-tests) and the ratio of mltrain's busbw to the best other; the last
# columns are mltrain forced onto TCP (MLTRAIN_COMM_TRANSPORT=tcp; TCP=0 leaves them out).
#
#   bench/compare.sh                       # 2 and 4 ranks, 4K..256M (x4 steps), a few minutes
#   RANKS="2" SIZES="4096 268435456" bench/compare.sh
#   BUILD=build-comm bench/compare.sh      # which CMake build dir holds mltrain-comm-bench
#
# Needs: libgloo-dev, libopenmpi-dev, openmpi-bin (Debian). Never fails on speed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build-comm}
ranks=${RANKS:-"2 4"}
sizes=${SIZES:-"4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456"}
work=$(mktemp -d /tmp/mltrain-compare.XXXXXX)
trap 'rm -rf "$work"' EXIT

need() { command -v "$1" >/dev/null || { echo "compare.sh: '$1' not found ($2)" >&2; exit 2; }; }
need mpicxx "apt-get install libopenmpi-dev openmpi-bin"
need mpirun "apt-get install openmpi-bin"
[[ -e /usr/include/gloo/allreduce_ring.h ]] || { echo "compare.sh: Gloo headers missing (apt-get install libgloo-dev)" >&2; exit 2; }

echo "# building benchmarks" >&2
if [[ ! -f $build/build.ninja && ! -f $build/Makefile ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j2 --target mltrain-comm-bench >/dev/null
bench=$build/comm/mltrain-comm-bench
g++ -O2 -std=c++17 "$root/bench/compare/gloo_allreduce.cpp" -o "$work/gloo_allreduce" -lgloo -lpthread
mpicxx -O2 "$root/bench/compare/mpi_allreduce.cpp" -o "$work/mpi_allreduce"

iters_for() {  # same schedule as the Gloo and MPI programs
  if (( $1 <= 65536 )); then echo 200; elif (( $1 <= 4194304 )); then echo 20;
  elif (( $1 <= 67108864 )); then echo 5; else echo 3; fi
}

run_mltrain() {  # ranks size [transport] -> "mltrain[-tcp] n bytes us"
  local n=$1 size=$2 transport=${3:-auto} port=$((20000 + RANDOM % 12000)) pids=() r  # ports below the ephemeral range
  local tag=mltrain
  [[ $transport == tcp ]] && tag=mltrain-tcp
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
      MLTRAIN_STORE_ADDR=127.0.0.1:$port MLTRAIN_TOKEN=compare MLTRAIN_COMM_TRANSPORT=$transport \
      "$bench" --op allreduce --dtype f32 --redop sum -b "$size" -e "$size" \
      -n "$(iters_for "$size")" -w 2 --stat median --json >"$work/ml.$r" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "compare.sh: mltrain-comm-bench failed at $n ranks, $size bytes" >&2; return 0; }; done
  sed -n 's/.*"size":\([0-9]*\).*"time_us":\([0-9.]*\).*/'"$tag $n"' \1 \2/p' "$work/ml.0"
}

run_gloo() {  # ranks size -> "gloo-<algorithm> n bytes us" lines
  local n=$1 size=$2 pids=() r
  rm -rf "$work/gloo-store" && mkdir -p "$work/gloo-store"
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n GLOO_STORE_DIR=$work/gloo-store "$work/gloo_allreduce" "$size" \
      >"$work/gloo.$r" 2>"$work/gloo.err.$r" &
    pids+=($!)
  done
  local failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if ((failed)); then
    echo "compare.sh: Gloo failed at $n ranks, $size bytes (left out):" >&2
    tail -n 2 "$work"/gloo.err.* >&2
    return 0
  fi
  cat "$work/gloo.0"
}

run_mpi() {  # ranks size -> "mpi n bytes us"; loopback only (other interfaces may come and go)
  mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    -np "$1" "$work/mpi_allreduce" "$2" 2>"$work/mpi.err" ||
    { echo "compare.sh: Open MPI failed at $1 ranks, $2 bytes (left out):" >&2; tail -3 "$work/mpi.err" >&2; }
}

# Interleaved per size, so the three see the same machine load (2 shared cores are noisy).
results=$work/results
: >"$results"
for n in $ranks; do
  for s in $sizes; do
    echo "# $n ranks, $s bytes: mltrain-comm (shm, tcp), gloo, open mpi" >&2
    run_mltrain "$n" "$s" >>"$results"
    [[ ${TCP:-1} == 1 ]] && run_mltrain "$n" "$s" tcp >>"$results"
    run_gloo "$n" "$s" >>"$results"
    run_mpi "$n" "$s" >>"$results"
  done
done

echo "# allreduce f32 sum, $(nproc) cores, $(date -u +%FT%TZ); time = median us per call; busbw GB/s"
awk '
  function busbw(n, bytes, us) { return bytes / us / 1e3 * 2 * (n - 1) / n }
  $1 == "mltrain" { ml[$2 " " $3] = $4; order[++count] = $2 " " $3 }
  $1 == "mpi"     { mpi[$2 " " $3] = $4 }
  $1 == "mltrain-tcp" { tcp[$2 " " $3] = $4 }
  $1 ~ /^gloo-/   { k = $2 " " $3; if (!(k in gl) || $4 < gl[k]) { gl[k] = $4; ga[k] = substr($1, 6) } }
  END {
    printf "%5s %10s | %10s %7s | %10s %7s %-20s | %10s %7s | %8s %8s | %10s %7s %7s\n", "ranks",
      "bytes", "mltrain_us", "busbw", "gloo_us", "busbw", "(best algorithm)", "mpi_us", "busbw",
      "x_best", "x_mpi", "ml_tcp_us", "busbw", "x_best"
    for (i = 1; i <= count; i++) {
      k = order[i]; split(k, p, " "); r = p[1]; b = p[2]
      m = busbw(r, b, ml[k])
      g = 0; gt = "-"; if (k in gl) { g = busbw(r, b, gl[k]); gt = sprintf("%.1f", gl[k]) }
      o = 0; ot = "-"; if (k in mpi) { o = busbw(r, b, mpi[k]); ot = sprintf("%.1f", mpi[k]) }
      best = g > o ? g : o
      xb = "-"; if (best > 0) xb = sprintf("%.2f", m / best)
      xm = "-"; if (o > 0) xm = sprintf("%.2f", m / o)
      t = 0; tt = "-"; xt = "-"
      if (k in tcp) { t = busbw(r, b, tcp[k]); tt = sprintf("%.1f", tcp[k]); if (best > 0) xt = sprintf("%.2f", t / best) }
      printf "%5d %10d | %10.1f %7.3f | %10s %7.3f %-20s | %10s %7.3f | %8s %8s | %10s %7.3f %7s\n",
        r, b, ml[k], m, gt, g, "(" ga[k] ")", ot, o, xb, xm, tt, t, xt
    }
  }' "$results"
