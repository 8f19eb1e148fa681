#!/bin/bash
# The GPU check in one call (issue 38, docs/gpu.md): on a machine with an NVIDIA GPU, from the
# bundle scripts/gpu-bundle.sh made (gpu-bundle/, or MLTRAIN_BUNDLE), else from a build made here:
#   gpus       what nvidia-smi sees
#   doctor     mltrain doctor: which NCCL, CUDA runtime and NVML files it found, every GPU
#   nccl       every collective x op x dtype through mltrain's NCCL backend at world 1
#   bench      allreduce through mltrain against raw ncclAllReduce, same device buffers, medians, ratio
#   torch      2 ranks on one GPU (procs_per_gpu = 2): backend auto, CUDA tensors through
#              mltrain.allreduce, DDP with allreduce_hook and ps_hook against a gloo run
#   top        top --once --json while a rank holds the GPU: every NVML field, the rank mapped to it
#   telemetry  what sampling costs the agent with this NVML (bench/telemetry_cost.sh)
# Each step prints its table and a verdict; one failing never stops the next. Everything goes to
# $OUT (default ./gpu-out), 8 files at most: summary.txt, log.txt, doctor.json, nccl-check.txt,
# nccl-bench.txt, torch.txt, top.json, telemetry.txt. Exit 0 when every step passed or skipped.
# MLTRAIN_GPU_REHEARSAL=1: no GPU; the bundle's fakes stand for NVML, cudart and NCCL, NCCL laid
# out as the nvidia-nccl-cu13 wheel of a Python (tests/e2e/test_gpu_rehearsal.py runs this in CI).
# Usage: tests/gpu/run.sh [BUILD_DIR]   (BUILD_DIR only when there is no bundle; default build-gpu)
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
rehearsal=${MLTRAIN_GPU_REHEARSAL:-0}
out=${OUT:-$repo/gpu-out}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
exec > >(tee "$out/log.txt") 2>&1
t0=$(date +%s)
work=$(mktemp -d)
export MLTRAIN_HOME=$work/home
mkdir -p "$MLTRAIN_HOME"
results=()

say() { echo "$@" | tee -a "$summary"; }
# step NAME SECONDS FUNCTION: runs it under a time limit; its last line "PASS ...", "FAIL ..." or
# "SKIP ..." is the verdict (anything else, or a timeout, is FAIL).
step() {
  local name=$1 secs=$2 fn=$3 s verdict
  say ""
  say "== $name"
  s=$(date +%s)
  verdict=$( (timeout -k 5 "$secs" bash -c "$(declare -f); $fn" 2>&1; echo "exit $?") | tee /dev/stderr |
    grep -E '^(PASS|FAIL|SKIP)|^exit ' | tail -2 | head -1)
  case $verdict in PASS*|FAIL*|SKIP*) ;; "exit 124"|"exit 137") verdict="FAIL timed out after ${secs}s" ;;
    *) verdict="FAIL no verdict ($verdict)" ;; esac
  say "$verdict"
  results+=("$(printf '%-10s %4ss  %s' "$name" "$(($(date +%s) - s))" "$verdict")")
}

# -- where mltrain comes from
bundle=${MLTRAIN_BUNDLE:-$repo/gpu-bundle}
if [ -x "$bundle/bin/mltrain" ]; then
  export ML=$bundle/bin/mltrain TOOLS=$bundle/bin FAKES=$bundle/fakes
  say "mltrain from the bundle $bundle ($(head -1 "$bundle/MANIFEST" 2>/dev/null))"
elif [ "$rehearsal" = 1 ]; then
  say "FAIL: the rehearsal runs from the bundle alone, and $bundle has none (scripts/gpu-bundle.sh)"
  exit 1
else
  build=${1:-build-gpu}
  say "no bundle at $bundle: building $build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build "$build" -j"$(nproc)" --target mltrain mltrain-nccl-check mltrain-nccl-bench || {
    say "FAIL: build (this machine may lack libssh, CLI11, ...: make the bundle elsewhere)"; exit 1; }
  export ML=$repo/$build/mltrain TOOLS=$repo/$build/tests/nccl FAKES=$repo/$build/tests/fakes
fi
export REHEARSAL=$rehearsal WORK=$work OUTDIR=$out REPO=$repo

# -- the rehearsal's stand-ins: a driver folder (NVML, nvidia-smi) and a Python whose
# site-packages holds NCCL as the wheel does (nvidia/nccl/lib) and cudart as nvidia/cu13/lib.
if [ "$rehearsal" = 1 ]; then
  conf=$'* gpus 1\n* name NVIDIA H200\n* memory_mib 143771\n* util 35\n* mem_used_mib 2048\n'
  mkdir -p "$work/driver"
  cp "$FAKES"/libnvidia-ml.so.1 "$FAKES"/nvidia-smi "$FAKES"/nvidia-smi-query "$work/driver/"
  printf '%s' "$conf" >"$work/driver/fake-gpus.conf"
  py=$(command -v python3)
  pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  site=$work/venv/lib/python$pyver/site-packages
  mkdir -p "$work/venv/bin" "$site/nvidia/nccl/lib" "$site/nvidia/cu13/lib"
  ln -s "$py" "$work/venv/bin/python3"
  # The fake NCCL finds its cudart beside itself ($ORIGIN); the real one links cudart in.
  cp "$FAKES/libnccl.so.2" "$FAKES/libcudart.so.13" "$site/nvidia/nccl/lib/"
  cp "$FAKES/libcudart.so.13" "$site/nvidia/cu13/lib/"
  printf '%s' "$conf" | tee "$site/nvidia/nccl/lib/fake-gpus.conf" >"$site/nvidia/cu13/lib/fake-gpus.conf"
  export PATH=$work/venv/bin:$work/driver:$PATH
  export MLTRAIN_NVML_LIBRARY=$work/driver/libnvidia-ml.so.1
  # No /dev/nvidiactl here: naming cudart is what makes the comm library load CUDA at all.
  export MLTRAIN_CUDART_LIBRARY=$site/nvidia/cu13/lib/libcudart.so.13
  # A real NCCL on the loader path or in /usr/local/cuda comes before the wheel (and fails on the
  # fake cudart): then name the wheel's file, and the wheel search is left to the unit test.
  if ls /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/lib/libnccl.so.2 2>/dev/null | grep -q . ||
    ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
    export MLTRAIN_NCCL_LIBRARY=$site/nvidia/nccl/lib/libnccl.so.2
    say "rehearsal: a real NCCL is on this machine: MLTRAIN_NCCL_LIBRARY names the wheel's fake"
  fi
  say "rehearsal: fakes from $FAKES; NCCL only in $site/nvidia/nccl/lib (the wheel layout)"
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  say "tests/gpu/run.sh: skipped: no GPU here (nvidia-smi -L fails or is missing)"
  exit 0
fi

step_gpus() {
  nvidia-smi -L
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,power.limit --format=csv
  [ "$(nvidia-smi -L | grep -c '^GPU ')" -ge 1 ] && echo "PASS $(nvidia-smi -L | grep -c '^GPU ') GPU(s)" ||
    echo "FAIL nvidia-smi lists no GPU"
}

step_doctor() {
  "$ML" doctor
  "$ML" doctor --json >"$OUTDIR/doctor.json"
  local nccl
  nccl=$("$ML" doctor | sed -n 's/^[^:]*: NCCL //p' | head -1)
  if [ -z "$nccl" ]; then echo "FAIL doctor found no NCCL"; return; fi
  if [ "$REHEARSAL" = 1 ] && ! grep -qE 'nvidia/nccl/lib/libnccl.so.2 \((python |MLTRAIN_NCCL_LIBRARY)' <<<"$nccl"; then
    echo "FAIL NCCL not found in the wheel layout: $nccl"; return
  fi
  echo "PASS NCCL $nccl"
}

job() {  # job FILE PROCS ARGV...: a one-host job on GPU(s), backend nccl
  local f=$1 n=$2; shift 2
  local argv
  argv=$(printf '"%s", ' "$@")
  cat >"$f" <<TOML
[run]
argv = [${argv%, }]
workdir = "$WORK"
[cluster]
procs_per_host = $n
[comm]
backend = "nccl"
[gpus]
per_proc = 1
TOML
}

step_nccl() {
  job "$WORK/check.toml" 1 "$TOOLS/mltrain-nccl-check"
  "$ML" run "$WORK/check.toml" >"$OUTDIR/nccl-check.txt" 2>&1
  local rc=$?
  grep -E 'backend|#wrong [1-9]|all results correct|FAILED' "$OUTDIR/nccl-check.txt" | head -20
  printf '%-12s %s\n' "cases" "$(grep -c '#wrong' "$OUTDIR/nccl-check.txt")" \
    "wrong" "$(grep -c '#wrong [1-9]' "$OUTDIR/nccl-check.txt")"
  [ $rc = 0 ] && grep -q 'all results correct' "$OUTDIR/nccl-check.txt" && echo "PASS every op x dtype correct" ||
    { tail -15 "$OUTDIR/nccl-check.txt"; echo "FAIL nccl-check exit $rc"; }
}

step_bench() {
  local max=1G
  [ "$REHEARSAL" = 1 ] && max=4M  # the fake NCCL moves bytes over TCP
  job "$WORK/bench.toml" 1 "$TOOLS/mltrain-nccl-bench" -b 1M -e "$max" -f 4
  "$ML" run "$WORK/bench.toml" >"$OUTDIR/nccl-bench.txt" 2>&1
  local rc=$?
  sed -n 's/^\[0\] //p' "$OUTDIR/nccl-bench.txt"
  [ $rc = 0 ] || { tail -15 "$OUTDIR/nccl-bench.txt"; echo "FAIL nccl-bench exit $rc"; return; }
  # The claim: through mltrain within 5% of raw at >= 64 MiB (the last column is the ratio).
  local worst
  worst=$(sed -n 's/^\[0\] //p' "$OUTDIR/nccl-bench.txt" | awk '$1+0 >= 67108864 && $NF+0 > 0 {if ($NF > w) w = $NF} END {print w+0}')
  if [ "$REHEARSAL" = 1 ]; then echo "PASS ran (fakes: no timing claim)"
  elif awk -v w="$worst" 'BEGIN {exit !(w > 0 && w <= 1.05)}'; then echo "PASS worst ratio at >= 64 MiB: $worst"
  else echo "FAIL worst ratio at >= 64 MiB: $worst (over 1.05, or no row: see the table)"; fi
}

step_torch() {
  python3 -c 'import torch' 2>/dev/null || { echo "SKIP python3 has no torch"; return; }
  local mode rc fails=0
  for mode in gloo hook ps; do
    {
      echo "[run]"
      echo "argv = [\"$(command -v python3)\", \"$REPO/tests/gpu/torch_ranks.py\", \"--mode\", \"$mode\"]"
      echo "workdir = \"$WORK\""
      echo "[cluster]"
      echo "procs_per_host = 2"
      echo "[comm]"
      echo "backend = \"auto\""
      echo "[gpus]"
      echo "procs_per_gpu = 2"
      if [ $mode = ps ]; then printf '[ps]\nservers_per_host = 1\nsync = true\n'; fi
    } >"$WORK/torch-$mode.toml"
    "$ML" run "$WORK/torch-$mode.toml" >"$WORK/torch-$mode.txt" 2>&1
    rc=$?
    echo "-- $mode (exit $rc)" >>"$OUTDIR/torch.txt"
    cat "$WORK/torch-$mode.txt" >>"$OUTDIR/torch.txt"
    [ $rc = 0 ] || fails=$((fails + 1))
  done
  printf '%-6s %-18s %s\n' MODE DIGEST NOTE
  for mode in gloo hook ps; do
    printf '%-6s %-18s %s\n' $mode "$(grep -ho 'final weights sha256 [0-9a-f]*' "$WORK/torch-$mode.txt" | sort -u | awk '{print $4}' | paste -sd, -)" \
      "$(grep -ho 'TORCH-NOTE .*' "$WORK/torch-$mode.txt" | sort -u | cut -c12- | paste -sd';' -)"
  done
  local digests
  digests=$(grep -ho 'final weights sha256 [0-9a-f]*' "$WORK"/torch-*.txt | sort -u | wc -l)
  [ $fails = 0 ] && [ "$digests" = 1 ] && echo "PASS gloo, allreduce_hook and ps_hook end with equal weights" ||
    echo "FAIL $fails run(s) failed, $digests distinct final weights (torch.txt)"
}

step_top() {
  job "$WORK/hold.toml" 1 "$(command -v python3)" "$REPO/tests/gpu/torch_ranks.py" --mode hold --seconds 25
  sed -i 's/^backend = "nccl"/backend = "auto"/' "$WORK/hold.toml"
  "$ML" run -d "$WORK/hold.toml" >"$WORK/hold.txt" 2>&1 || { cat "$WORK/hold.txt"; echo "FAIL run -d"; return; }
  sleep 8
  "$ML" top --once
  "$ML" top --once --json >"$OUTDIR/top.json"
  "$ML" stop latest >/dev/null 2>&1
  python3 - "$OUTDIR/top.json" "$REHEARSAL" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
gpus = j.get("gpus", [])
if not gpus:
    print("FAIL top shows no GPU", j.get("problems")); sys.exit()
print("%-4s %-10s %s" % ("GPU", "RANKS", "NULL FIELDS"))
bad = []
for g in gpus:
    nulls = [k for k, v in g.items() if v is None]
    print("%-4s %-10s %s" % (g.get("index"), g.get("ranks"), ",".join(nulls) or "-"))
    if nulls: bad.append("GPU %s: %s null" % (g.get("index"), ",".join(nulls)))
    if not g.get("ranks") and sys.argv[2] != "1": bad.append("GPU %s: no rank mapped" % g.get("index"))
print("FAIL " + "; ".join(bad) if bad else "PASS every NVML field set" + ("" if sys.argv[2] == "1" else ", the rank mapped"))
PY
}

step_telemetry() {
  local rounds=2 secs=10
  [ "$REHEARSAL" = 1 ] && rounds=1 secs=2
  GPUS=real RANKS=1 MLTRAIN_BIN="$ML" "$REPO/bench/telemetry_cost.sh" $rounds $secs >"$OUTDIR/telemetry.txt" 2>&1
  local rc=$?
  cat "$OUTDIR/telemetry.txt"
  [ $rc = 0 ] && echo "PASS measured (see the medians)" || echo "FAIL telemetry_cost.sh exit $rc"
}

step gpus 15 step_gpus
step doctor 45 step_doctor
step nccl 75 step_nccl
step bench 90 step_bench
step torch 120 step_torch
step top 50 step_top
step telemetry 75 step_telemetry

say ""
say "== summary ($(($(date +%s) - t0)) s$([ "$rehearsal" = 1 ] && echo ', rehearsal with the fakes'))"
for r in "${results[@]}"; do say "$r"; done
rm -rf "$work"
if printf '%s\n' "${results[@]}" | grep -q '  FAIL'; then exit 1; fi
exit 0
