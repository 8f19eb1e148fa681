#!/usr/bin/env bash
# bench/compare_cluster.sh: allreduce (f32, sum) with 4 ranks, one per host of the 4-host test
# cluster (tests/cluster/: network namespaces mlt-h1..mlt-h4 on bridge mltbr0), for mltrain-comm
# (TCP between hosts), Gloo (its TCP transport, best of its 4 algorithms) and Open MPI
# MPI_Allreduce (--mca btl tcp,self), beside the traffic those hosts can carry together, measured
# in the same run with iperf3.
#
# All four "hosts" share this machine's cores, so the ceiling is not a NIC's line rate but what
# the 4 veth links carry at once: iperf3 servers in every namespace and 4 clients at the same
# time in a ring (h1->h2, h2->h3, h3->h4, h4->h1), DURATION seconds, IPERF_ARGS (-l 1M); ring ceiling = sum of the 4
# throughputs, per-link ceiling = ring ceiling / 4. Measured before and after the benchmarks; the
# higher of the two is used. In a ring allreduce each rank sends 2(n-1)/n of the buffer to its
# right neighbour, all links at once, so busbw (= algbw * 2(n-1)/n, as nccl-tests) is the payload
# rate of each link: busbw / per-link ceiling is the fraction of the ceiling an allreduce reaches
# (column `of_ceil`).
#
# The machine is noisy (a shared VM): each peer runs ROUNDS times (default 5) per size, rounds
# interleaved and the peers' order rotated per round; the table shows the median over rounds of
# each run's own median (Gloo: each algorithm's, then the best algorithm), and one line per size
# with the ratio in every round, so the spread is visible.
#
# How each runs (one rank per namespace, all from this root namespace):
#   mltrain  `ip netns exec mlt-hK env RANK=.. WORLD_SIZE=4 MLTRAIN_STORE_ADDR=10.231.0.11:PORT
#            MLTRAIN_COMM_HOST=hK MLTRAIN_COMM_TRANSPORT=tcp .. mltrain-comm-bench`
#            (the namespaces share the UTS name seen by `ip netns exec`, so the host identity
#            is set explicitly: without it the ranks would use shared memory)
#   Gloo     bench/compare/gloo_allreduce.cpp, built here with its device address taken from
#            GLOO_HOSTNAME (the original binds 127.0.0.1, which is per namespace); FileStore in a
#            shared directory (the namespaces share the file system); `ip netns exec` per rank
#   Open MPI bench/compare/mpi_allreduce.cpp, `mpirun` over ssh -F ssh_config with a hostfile
#            h1..h4 slots=1 (orted per host, as bench/launch does), --mca pml ob1 --mca btl
#            tcp,self, btl/oob_tcp_if_include 10.231.0.0/24; ranks run as the cluster's login user
#
#   bench/compare_cluster.sh                         # 16M, 64M, 256M, 5 rounds; about 9 minutes
#   ROUNDS=3 SIZES="16777216" bench/compare_cluster.sh
#   SIZES="16777216" bench/compare_cluster.sh
#   BUILD=build-comm DURATION=5 bench/compare_cluster.sh
#
# Needs root, the test cluster (brought up with tests/cluster/up.sh -n 4 when it is not up; left
# up), iperf3 (apt-get install -y iperf3), libgloo-dev, libopenmpi-dev + openmpi-bin. A peer that
# cannot run is reported (why) instead of failing. Never fails on speed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
[[ $build == /* ]] || build=$root/$build
sizes=${SIZES:-"16777216 67108864 268435456"}
duration=${DURATION:-5}
rounds=${ROUNDS:-5}
iperf_args=${IPERF_ARGS:-"-l 1M"}  # 1 MiB writes: ~10-15% more than iperf3's default 128K here
cdir=${MLTRAIN_CLUSTER_DIR:-/tmp/mltrain-cluster}
cfg=$cdir/ssh_config
hosts=(h1 h2 h3 h4)
n=${#hosts[@]}
ip_of() { echo "10.231.0.$((10 + ${1#h}))"; }

log() { echo "# $*" >&2; }
work=$(mktemp -d /tmp/mltrain-compare-cluster.XXXXXX)
chmod 755 "$work"  # the Open MPI ranks run as the cluster's login user
trap 'rm -rf "$work"' EXIT

[[ $(id -u) == 0 ]] || { echo "compare_cluster.sh: needs root (network namespaces)" >&2; exit 2; }

# -- cluster ---------------------------------------------------------------------------------------
cluster_ok() {
  [[ -f $cfg ]] || return 1
  local h
  for h in "${hosts[@]}"; do
    ip netns exec "mlt-$h" true 2>/dev/null || return 1
    timeout 10 ssh -F "$cfg" -o BatchMode=yes -o ConnectTimeout=2 "$h" true </dev/null >/dev/null 2>&1 || return 1
  done
}
if ! cluster_ok; then
  log "test cluster not up: tests/cluster/up.sh -n $n"
  "$root/tests/cluster/up.sh" -n "$n" -d "$cdir" >&2 || { echo "compare_cluster.sh: cluster did not come up" >&2; exit 2; }
fi

# -- builds ----------------------------------------------------------------------------------------
bench=$build/comm/mltrain-comm-bench
ml_why="" gloo_why="" mpi_why=""
log "building mltrain-comm-bench ($build)"
if [[ ! -f $build/build.ninja && ! -f $build/Makefile ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null 2>&1
fi
cmake --build "$build" -j2 --target mltrain-comm-bench >"$work/build.log" 2>&1 ||
  log "build of mltrain-comm-bench failed (using the existing binary if any): $(tail -2 "$work/build.log" | tr '\n' ' ')"
[[ -x $bench ]] || ml_why="$bench not built"

if [[ ! -e /usr/include/gloo/allreduce_ring.h ]]; then
  gloo_why="Gloo headers missing (apt-get install libgloo-dev)"
else
  log "building Gloo allreduce (device address from GLOO_HOSTNAME)"
  sed 's|attr.hostname = "127.0.0.1";|attr.hostname = std::getenv("GLOO_HOSTNAME") ? std::getenv("GLOO_HOSTNAME") : "127.0.0.1";|' \
    "$root/bench/compare/gloo_allreduce.cpp" >"$work/gloo_allreduce.cpp"
  grep -q GLOO_HOSTNAME "$work/gloo_allreduce.cpp" || gloo_why="bench/compare/gloo_allreduce.cpp changed: cannot set its device address"
  [[ -n $gloo_why ]] || g++ -O2 -std=c++17 -I"$root/bench/compare" "$work/gloo_allreduce.cpp" -o "$work/gloo_allreduce" \
    -lgloo -lpthread 2>"$work/gloo.build" || gloo_why="Gloo build failed: $(tail -2 "$work/gloo.build" | tr '\n' ' ')"
fi

if ! command -v mpicxx >/dev/null || ! command -v mpirun >/dev/null; then
  mpi_why="Open MPI not found (apt-get install libopenmpi-dev openmpi-bin)"
else
  log "building Open MPI allreduce"
  mpicxx -O2 "$root/bench/compare/mpi_allreduce.cpp" -o "$work/mpi_allreduce" 2>"$work/mpi.build" ||
    mpi_why="MPI build failed: $(tail -2 "$work/mpi.build" | tr '\n' ' ')"
  chmod 755 "$work/mpi_allreduce" 2>/dev/null
fi

# -- the ceiling: iperf3 in a ring, all links at once ---------------------------------------------
ceiling() {  # tag -> "ceil TAG sum_bps l1 l2 l3 l4" (bits/s) or "ceilerr TAG why"
  local tag=$1 i h next pids=() port=$((5300 + RANDOM % 600))
  command -v iperf3 >/dev/null || { echo "ceilerr $tag iperf3 not found (apt-get install -y iperf3)"; return 0; }
  for h in "${hosts[@]}"; do
    ip netns exec "mlt-$h" iperf3 -s -D -1 -p "$port" --pidfile "$work/iperf.$h.pid" >/dev/null 2>&1
  done
  sleep 0.5
  for ((i = 0; i < n; i++)); do
    h=${hosts[i]} next=${hosts[(i + 1) % n]}
    timeout $((duration + 20)) ip netns exec "mlt-$h" iperf3 -c "$(ip_of "$next")" -p "$port" -t "$duration" $iperf_args -J \
      >"$work/iperf.$tag.$h.json" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for h in "${hosts[@]}"; do  # servers are one-off; make sure none is left
    [[ -f $work/iperf.$h.pid ]] && kill "$(cat "$work/iperf.$h.pid")" 2>/dev/null
    rm -f "$work/iperf.$h.pid"
  done
  python3 - "$tag" "$work" "${hosts[@]}" <<'EOF'
import json, sys
tag, work, hosts = sys.argv[1], sys.argv[2], sys.argv[3:]
rates = []
for h in hosts:
    try:
        j = json.load(open(f"{work}/iperf.{tag}.{h}.json"))
        rates.append(j["end"]["sum_received"]["bits_per_second"])
    except Exception as e:
        err = ""
        try:
            err = json.load(open(f"{work}/iperf.{tag}.{h}.json")).get("error", "")
        except Exception:
            err = open(f"{work}/iperf.{tag}.{h}.json", errors="replace").read()[-200:]
        print(f"ceilerr {tag} iperf3 from {h} failed: {err or e}".replace("\n", " "))
        sys.exit(0)
print("ceil", tag, sum(rates), *rates)
EOF
}

# -- the three allreduces ----------------------------------------------------------------------------
iters_for() {  # the schedule of bench/compare/*.cpp (Gloo and MPI have it built in)
  if (( $1 <= 65536 )); then echo 200; elif (( $1 <= 4194304 )); then echo 20;
  elif (( $1 <= 67108864 )); then echo 5; else echo 3; fi
}
limit_for() { if (( $1 >= 268435456 )); then echo 150; else echo 90; fi; }  # seconds per run

kill_pids() { local p; for p in "$@"; do kill -9 "$p" 2>/dev/null; done; }

run_mltrain() {  # size -> "mltrain n bytes us" | "why mltrain size reason"
  local size=$1 port=$((20000 + RANDOM % 12000)) pids=() r failed=0
  [[ -z $ml_why ]] || { echo "why mltrain $size $ml_why"; return 0; }
  for ((r = 0; r < n; r++)); do
    timeout "$(limit_for "$size")" ip netns exec "mlt-${hosts[r]}" env RANK=$r WORLD_SIZE=$n \
      LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR="$(ip_of h1)" \
      MLTRAIN_STORE_ADDR="$(ip_of h1):$port" MLTRAIN_TOKEN=compare-cluster \
      MLTRAIN_COMM_HOST="${hosts[r]}" MLTRAIN_COMM_TRANSPORT=tcp MLTRAIN_COMM_TIMEOUT=60 \
      "$bench" --op allreduce --dtype f32 --redop sum -b "$size" -e "$size" \
      -n "$(iters_for "$size")" -w 2 --stat median --json >"$work/ml.$r" 2>"$work/ml.err.$r" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if ((failed)) || ! grep -q '"time_us"' "$work/ml.0"; then
    echo "why mltrain $size mltrain-comm-bench failed: $(cat "$work"/ml.err.* | grep -v '^#' | head -2 | tr '\n' ' ')"
    return 0
  fi
  sed -n 's/.*"size":\([0-9]*\).*"time_us":\([0-9.]*\).*/'"mltrain $n"' \1 \2/p' "$work/ml.0"
}

run_gloo() {  # size -> "gloo-<algorithm> n bytes us" lines | "why gloo size reason"
  local size=$1 pids=() r failed=0
  [[ -z $gloo_why ]] || { echo "why gloo $size $gloo_why"; return 0; }
  rm -rf "$work/gloo-store" && mkdir -p "$work/gloo-store"
  for ((r = 0; r < n; r++)); do
    timeout "$(limit_for "$size")" ip netns exec "mlt-${hosts[r]}" env RANK=$r WORLD_SIZE=$n \
      GLOO_STORE_DIR="$work/gloo-store" GLOO_HOSTNAME="$(ip_of "${hosts[r]}")" \
      "$work/gloo_allreduce" "$size" >"$work/gloo.$r" 2>"$work/gloo.err.$r" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if ((failed)) || ! grep -q '^gloo-' "$work/gloo.0"; then
    echo "why gloo $size Gloo failed: $(cat "$work"/gloo.err.* | head -2 | tr '\n' ' ')"
    return 0
  fi
  cat "$work/gloo.0"
}

run_mpi() {  # size -> "mpi n bytes us" | "why mpi size reason"
  local size=$1 h
  [[ -z $mpi_why ]] || { echo "why mpi $size $mpi_why"; return 0; }
  for h in "${hosts[@]}"; do echo "$h slots=1"; done >"$work/mpi.hosts"
  if ! timeout "$(limit_for "$size")" mpirun --allow-run-as-root --hostfile "$work/mpi.hosts" -np "$n" \
      --mca plm_rsh_agent ssh --mca plm_rsh_args "-F $cfg -o BatchMode=yes" \
      --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.231.0.0/24 \
      --mca oob_tcp_if_include 10.231.0.0/24 --bind-to none \
      "$work/mpi_allreduce" "$size" </dev/null >"$work/mpi.out" 2>"$work/mpi.err" ||
      ! grep -q '^mpi ' "$work/mpi.out"; then
    echo "why mpi $size mpirun failed: $(grep -v '^[-[:space:]]*$' "$work/mpi.err" | head -3 | tr '\n' ' ')"
    return 0
  fi
  grep '^mpi ' "$work/mpi.out"
}

# -- run -------------------------------------------------------------------------------------------
results=$work/results
: >"$results"
t_start=$(date +%s)
log "ceiling (iperf3, 4 links at once, ${duration} s)"
ceiling before >>"$results"
for ((round = 1; round <= rounds; round++)); do
  for s in $sizes; do  # interleaved per size and round, so all three see the same machine load
    log "round $round/$rounds, $s bytes: mltrain-comm (tcp), gloo, open mpi"
    peers=(run_mltrain run_gloo run_mpi)
    for ((k = 0; k < 3; k++)); do  # rotate who goes first: no peer always gets the coolest slot
      "${peers[(k + round - 1) % 3]}" "$s" | sed "s/^/$round /" >>"$results"
    done
  done
done
log "ceiling again (iperf3, ${duration} s)"
ceiling after >>"$results"

echo "# allreduce f32 sum, $n ranks on $n test-cluster hosts (netns, TCP over veth+bridge), $(nproc) cores," \
  "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ), $(( $(date +%s) - t_start )) s"
awk -v n="$n" -v rounds="$rounds" '
  function busbw(n, bytes, us) { return bytes / us / 1e3 * 2 * (n - 1) / n }
  function median(list,    k, m, v, i, j, t) {  # list: space-separated numbers
    m = split(list, v, " ")
    for (i = 2; i <= m; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
    return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
  }
  $1 == "ceil"    { c[$2] = $3; links[$2] = sprintf("%.2f %.2f %.2f %.2f", $4/8e9, $5/8e9, $6/8e9, $7/8e9); next }
  $1 == "ceilerr" { $1 = ""; cerr[$2] = $0; next }
  { rd = $1; $1 = ""; $0 = substr($0, 2) }  # the round number
  $1 == "why"     { k = $3; w = $2; $1 = $2 = $3 = ""; why[w " " k] = substr($0, 4); whyn[w " " k]++ }
  $1 == "mltrain" { ml[$3] = ml[$3] " " $4; mlr[$3, rd] = $4 }
  $1 == "mpi"     { mpi[$3] = mpi[$3] " " $4; mpir[$3, rd] = $4 }
  $1 ~ /^gloo-/   { a = substr($1, 6); gla[$3, a] = gla[$3, a] " " $4; algos[a] = 1
                    if (!(($3, rd) in glr) || $4 < glr[$3, rd]) glr[$3, rd] = $4 }
  { if ($1 == "mltrain" || $1 == "mpi" || $1 ~ /^gloo-/ || $1 == "why") if (!($3 in seen)) { seen[$3] = 1; order[++cnt] = $3 } }
  END {
    ceil = 0
    split("before after", tags, " ")
    for (ti = 1; ti <= 2; ti++) {
      t = tags[ti]; if (!(t in c)) continue
      printf "# ceiling %-6s: ring sum %.2f GB/s, per link %.2f GB/s (h1>h2 h2>h3 h3>h4 h4>h1: %s GB/s)\n",
        t, c[t] / 8e9, c[t] / 8e9 / n, links[t]
      if (c[t] > ceil) ceil = c[t]
    }
    for (t in cerr) printf "# ceiling %s: not measured:%s\n", t, cerr[t]
    if (ceil == 0) printf "# ceiling not measured: of_ceil left out\n"
    per_link = ceil / 8e9 / n
    if (ceil > 0) printf "# of_ceil = busbw / per-link ceiling (%.2f GB/s = the higher ring sum / %d)\n", per_link, n
    printf "# times: median over %d interleaved rounds of each peer'"'"'s own median; gloo: its best algorithm by that median\n", rounds
    printf "%10s | %10s %7s %7s | %10s %7s %-20s | %10s %7s | %7s %7s\n", "bytes", "mltrain_us", "busbw",
      "of_ceil", "gloo_us", "busbw", "(best algorithm)", "mpi_us", "busbw", "x_best", "x_mpi"
    for (i = 1; i <= cnt; i++) {
      b = order[i]
      m = 0; mt = "-"; if (b in ml) { mu = median(ml[b]); m = busbw(n, b, mu); mt = sprintf("%.1f", mu) }
      g = 0; gt = "-"; ga = ""
      for (a in algos) if ((b, a) in gla) { u = median(gla[b, a]); if (gt == "-" || u < gu) { gu = u; gt = sprintf("%.1f", u); ga = a } }
      if (gt != "-") g = busbw(n, b, gu)
      o = 0; ot = "-"; if (b in mpi) { ou = median(mpi[b]); o = busbw(n, b, ou); ot = sprintf("%.1f", ou) }
      best = g > o ? g : o
      xb = "-"; if (best > 0 && m > 0) xb = sprintf("%.2f", m / best)
      xm = "-"; if (o > 0 && m > 0) xm = sprintf("%.2f", m / o)
      fc = "-"; if (per_link > 0 && m > 0) fc = sprintf("%.2f", m / per_link)
      printf "%10d | %10s %7.3f %7s | %10s %7.3f %-20s | %10s %7.3f | %7s %7s\n",
        b, mt, m, fc, gt, g, "(" ga ")", ot, o, xb, xm
    }
    # Per round, so the spread is visible: mltrain busbw / best of (gloo best algorithm that round, mpi).
    for (i = 1; i <= cnt; i++) {
      b = order[i]; line = ""
      for (r = 1; r <= rounds; r++) {
        if (!((b, r) in mlr)) { line = line " -"; continue }
        best = 0; mark = ""
        if ((b, r) in glr) best = busbw(n, b, glr[b, r]); else mark = "*"
        if ((b, r) in mpir && busbw(n, b, mpir[b, r]) > best) best = busbw(n, b, mpir[b, r])
        if (!((b, r) in mpir)) mark = mark "+"
        line = line (best > 0 ? sprintf(" %.2f%s", busbw(n, b, mlr[b, r]) / best, mark) : " -")
        if (mark != "") marked = 1
      }
      printf "# %10d x_best per round (vs that round'"'"'s fastest gloo algorithm):%s\n", b, line
    }
    if (marked) printf "# *: no gloo result that round, +: no open mpi result (see below): the ratio is against the other\n"
    for (k in why) {
      split(k, kw, " ")
      has = (kw[1] == "mltrain" && (kw[2] in ml)) || (kw[1] == "mpi" && (kw[2] in mpi))
      if (kw[1] == "gloo") for (a in algos) if ((kw[2], a) in gla) has = 1
      if (has) printf "# %s failed in %d of %d rounds (its median is over the others): %s\n", k, whyn[k], rounds, why[k]
      else printf "# left out: %s\n", k ": " why[k]
    }
  }' "$results"
