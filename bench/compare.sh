#!/usr/bin/env bash
# bench/compare.sh: allreduce (f32, sum) of mltrain-comm-bench beside Gloo's allreduce
# algorithms (Gloo TCP transport) and Open MPI MPI_Allreduce twice: over shared memory, its
# default on one host (--mca btl vader,self; "mpi-sm"), and over TCP loopback (--mca btl tcp,self;
# "mpi-tcp"), for the same ranks and sizes on this host. Prints one table: median time per call,
# busbw (algbw * 2(n-1)/n, as nccl-tests), x_best = mltrain's busbw over the best peer's at that
# size (best of Gloo's algorithms, mpi-sm and mpi-tcp; the peer is named) and x_mpi_sm = mltrain's
# over mpi-sm's (both shared memory: the like-for-like pair on one host). The last columns are
# mltrain forced onto TCP (MLTRAIN_COMM_TRANSPORT=tcp; TCP=0 leaves them out), with x_tcp = its
# busbw over the best TCP peer's (Gloo or mpi-tcp, named).
#
# ROUNDS=N (default 1) runs every peer N times per size, rounds interleaved and the order rotated
# each round; the table then gives the median over rounds of each run's median (Gloo: its best
# algorithm by that median). On a loaded machine one run can be off by 1000x (a rank descheduled
# at every hop), so ROUNDS=3 is worth its time there.
#
# Open MPI's vader copies large messages with CMA (process_vm_readv), which some containers forbid;
# a probe at the start checks it and, where it fails, mpi-sm runs with
# --mca btl_vader_single_copy_mechanism none (two copies through a shared buffer) and the table's
# header says so.
#
#   bench/compare.sh                       # 2 and 4 ranks, 4K..256M (x4 steps), about 5 minutes
#   RANKS="2" SIZES="4096 268435456" bench/compare.sh
#   ROUNDS=3 bench/compare.sh              # medians of 3 interleaved rounds, 3x the time
#   BUILD=build-comm bench/compare.sh      # which CMake build dir holds mltrain-comm-bench
#
# Needs: libgloo-dev, libopenmpi-dev, openmpi-bin (Debian). Never fails on speed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build-comm}
ranks=${RANKS:-"2 4"}
sizes=${SIZES:-"4096 16384 65536 262144 1048576 4194304 16777216 67108864 268435456"}
rounds=${ROUNDS:-1}
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

mpirun_local() {  # np args.. -> mpirun on this host; loopback only (other interfaces may come and go)
  local np=$1; shift
  mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 \
    --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np "$np" "$@"
}

# Does vader's single copy (CMA) work here? 1 MiB is past its eager limit, so it takes that path
# (a failed read may hang rather than abort: hence --timeout).
vader_opts=(--mca btl 'vader,self')
vader_note="vader, CMA single copy"
if ! mpirun_local 2 --timeout 60 "${vader_opts[@]}" "$work/mpi_allreduce" 1048576 >/dev/null 2>"$work/mpi.probe"; then
  echo "compare.sh: Open MPI vader with CMA failed here (process_vm_readv not permitted?);" \
    "mpi-sm runs with --mca btl_vader_single_copy_mechanism none:" >&2
  tail -3 "$work/mpi.probe" >&2
  vader_opts+=(--mca btl_vader_single_copy_mechanism none)
  vader_note="vader, CMA not permitted here: single_copy_mechanism none"
fi

run_mpi() {  # ranks size sm|tcp -> "mpi-sm|mpi-tcp n bytes us"
  local opts=(--mca btl 'tcp,self')
  [[ $3 == sm ]] && opts=("${vader_opts[@]}")
  mpirun_local "$1" "${opts[@]}" "$work/mpi_allreduce" "$2" 2>"$work/mpi.err" | sed "s/^mpi /mpi-$3 /" ||
    { echo "compare.sh: Open MPI ($3) failed at $1 ranks, $2 bytes (left out):" >&2; tail -3 "$work/mpi.err" >&2; }
}

# Interleaved per size, so all of them see the same machine load (2 shared cores are noisy): each
# round runs every peer once, the order rotated by one each round (round 1: the two shared-memory
# runs, mltrain and mpi-sm, back to back, then the TCP ones).
peers=(mltrain mpi-sm)
[[ ${TCP:-1} == 1 ]] && peers+=(mltrain-tcp)
peers+=(gloo mpi-tcp)
run_peer() {  # peer ranks size
  case $1 in
    mltrain) run_mltrain "$2" "$3" ;;
    mltrain-tcp) run_mltrain "$2" "$3" tcp ;;
    gloo) run_gloo "$2" "$3" ;;
    mpi-sm) run_mpi "$2" "$3" sm ;;
    mpi-tcp) run_mpi "$2" "$3" tcp ;;
  esac
}
results=$work/results
: >"$results"
for n in $ranks; do
  for s in $sizes; do
    for ((round = 0; round < rounds; round++)); do
      order=()
      for ((j = 0; j < ${#peers[@]}; j++)); do order+=("${peers[(round + j) % ${#peers[@]}]}"); done
      echo "# $n ranks, $s bytes, round $((round + 1))/$rounds: ${order[*]}" >&2
      for p in "${order[@]}"; do run_peer "$p" "$n" "$s" >>"$results"; done
    done
  done
done

echo "# allreduce f32 sum, $(nproc) cores, $(date -u +%FT%TZ); time = median us per call" \
  "(median over $rounds interleaved rounds); busbw GB/s"
echo "# mpi_sm: Open MPI --mca btl vader,self ($vader_note); mpi_tcp: --mca btl tcp,self on lo"
echo "# x_best: mltrain busbw / best peer's (gloo, mpi-sm, mpi-tcp); x_tcp: ml_tcp busbw / best TCP peer's (gloo, mpi-tcp)"
awk '
  function busbw(n, bytes, us) { return bytes / us / 1e3 * 2 * (n - 1) / n }
  function cell(arr, k, n, b) { return (k in arr) ? sprintf("%10.1f %7.3f", arr[k], busbw(n, b, arr[k])) : sprintf("%10s %7s", "-", "-") }
  function median(key,   c, i, j, t, a) {  # of the values v[key, 1..n[key]]
    c = n[key]; for (i = 1; i <= c; i++) a[i] = v[key, i]
    for (i = 2; i <= c; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2
  }
  { k = $2 " " $3; key = $1 SUBSEP k; v[key, ++n[key]] = $4
    if ($1 == "mltrain" && !(k in seen)) { seen[k] = 1; order[++count] = k } }
  END {
    for (key in n) {
      split(key, q, SUBSEP); k = q[2]; m = median(key)
      if (q[1] == "mltrain") ml[k] = m
      else if (q[1] == "mpi-sm") sm[k] = m
      else if (q[1] == "mpi-tcp") mt[k] = m
      else if (q[1] == "mltrain-tcp") tcp[k] = m
      else if (q[1] ~ /^gloo-/ && (!(k in gl) || m < gl[k])) { gl[k] = m; ga[k] = substr(q[1], 6) }
    }
    printf "%5s %10s | %10s %7s | %10s %7s %-20s | %10s %7s | %10s %7s | %7s %-8s %8s | %10s %7s %7s %s\n",
      "ranks", "bytes", "mltrain_us", "busbw", "gloo_us", "busbw", "(best algorithm)", "mpi_sm_us", "busbw",
      "mpi_tcp_us", "busbw", "x_best", "(peer)", "x_mpi_sm", "ml_tcp_us", "busbw", "x_tcp", "(peer)"
    for (i = 1; i <= count; i++) {
      k = order[i]; split(k, p, " "); r = p[1]; b = p[2]
      m = busbw(r, b, ml[k])
      # fastest TCP peer, then fastest of all (same ranks and bytes: least time = most busbw)
      tb = ""; tu = 0
      if (k in gl) { tb = "gloo"; tu = gl[k] }
      if ((k in mt) && (tb == "" || mt[k] < tu)) { tb = "mpi-tcp"; tu = mt[k] }
      bb = tb; bu = tu
      if ((k in sm) && (bb == "" || sm[k] < bu)) { bb = "mpi-sm"; bu = sm[k] }
      xb = "-"; if (bb != "") xb = sprintf("%.2f", m / busbw(r, b, bu))
      xs = "-"; if (k in sm) xs = sprintf("%.2f", m / busbw(r, b, sm[k]))
      xt = "-"; if ((k in tcp) && tb != "") xt = sprintf("%.2f", busbw(r, b, tcp[k]) / busbw(r, b, tu))
      printf "%5d %10d | %10.1f %7.3f | %s %-20s | %s | %s | %7s %-8s %8s | %s %7s%s\n",
        r, b, ml[k], m, cell(gl, k, r, b), (k in gl) ? "(" ga[k] ")" : "", cell(sm, k, r, b),
        cell(mt, k, r, b), xb, (bb != "") ? "(" bb ")" : "", xs, cell(tcp, k, r, b), xt,
        (xt != "-") ? " (" tb ")" : ""
    }
  }' "$results"
