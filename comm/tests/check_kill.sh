#!/usr/bin/env bash
# Fault test with real processes: SIGKILL rank 1 of 3 in the middle of a long allreduce sweep;
# ranks 0 and 2 must exit non-zero within a few seconds, their error naming rank 1.
# Runs once over shared memory and once over TCP.
#   comm/tests/check_kill.sh PATH_TO_mltrain-comm-bench
set -euo pipefail
bench=${1:?usage: check_kill.sh PATH_TO_mltrain-comm-bench}
work=$(mktemp -d /tmp/mltrain-kill.XXXXXX)
trap 'rm -rf "$work"' EXIT
status=0
for transport in shm tcp; do
  port=$((20000 + RANDOM % 12000))  # below the ephemeral range
  pids=()
  for r in 0 1 2; do
    RANK=$r WORLD_SIZE=3 MLTRAIN_STORE_ADDR=127.0.0.1:$port MLTRAIN_TOKEN=kill \
      MLTRAIN_COMM_TRANSPORT=$transport MLTRAIN_COMM_TIMEOUT=5 \
      "$bench" -b 64M -e 64M -n 1000 -w 0 >"$work/out.$r" 2>"$work/err.$r" &
    pids+=($!)
  done
  sleep 4  # past start-up and the 0.5 s warm-up: inside the 64 MiB allreduces
  kill -9 "${pids[1]}"; disown "${pids[1]}" 2>/dev/null || true
  start=$(date +%s.%N)
  for r in 0 2; do
    if wait "${pids[$r]}"; then
      echo "FAIL ($transport): rank $r exited 0 after rank 1 was killed" >&2; status=1
    fi
  done
  wait "${pids[1]}" 2>/dev/null || true
  took=$(echo "$(date +%s.%N) - $start" | bc)
  for r in 0 2; do
    if ! grep -q "rank 1 " "$work/err.$r"; then
      echo "FAIL ($transport): rank $r's error does not name rank 1:" >&2; cat "$work/err.$r" >&2; status=1
    fi
  done
  echo "$transport: ranks 0 and 2 failed ${took}s after rank 1 was killed"
  sed "s/^/  rank 0: /" "$work/err.0"; sed "s/^/  rank 2: /" "$work/err.2"
  if (( $(echo "$took > 4" | bc) )); then echo "FAIL ($transport): too slow" >&2; status=1; fi
done
exit $status
