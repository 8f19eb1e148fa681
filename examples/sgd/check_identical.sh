#!/usr/bin/env bash
# Runs the fixed-point SGD worker on 1, 2 and 4 ranks (processes on this host, over the real
# store and shared memory) and checks the final weights are bitwise identical.
#   examples/sgd/check_identical.sh build/examples/sgd/mltrain-sgd
set -euo pipefail
worker=${1:?usage: check_identical.sh PATH_TO_mltrain-sgd}
run() {
  local n=$1 port=$((20000 + RANDOM % 12000)) pids=() r  # ports below the ephemeral range
  local out
  out=$(mktemp)
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
      MLTRAIN_STORE_ADDR=127.0.0.1:$port MLTRAIN_TOKEN=sgd MLTRAIN_COMM_TIMEOUT=60 \
      "$worker" --steps 100 --print-every 1000 >"$out.$r" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  grep 'checksum' "$out.0" | awk '{print $3}'
  rm -f "$out" "$out".*
}
one=$(run 1); two=$(run 2); four=$(run 4)
echo "weights checksum: 1 rank $one, 2 ranks $two, 4 ranks $four"
[[ -n $one && $one == "$two" && $one == "$four" ]] || { echo "FAIL: not bitwise identical" >&2; exit 1; }
echo "OK: bitwise identical"
