#!/usr/bin/env bash
# Sets everything up on Debian 12 (as root, or with sudo) and runs the whole test suite:
# unit tests (also under ASan+UBSan), the comm tier, then the end-to-end tests against the
# built binary. Prints a table of each stage's time at the end (docs/testing.md).
# Usage: scripts/test.sh [--quick] [--no-sanitize] [--unit-only] [-- PYTEST_ARGS...]
#   --quick: format check, build, unit tier and the local e2e smoke set (pytest -m smoke) only.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=1 unit_only=0 quick=0 pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --no-sanitize) sanitize=0 ;;
    --unit-only) unit_only=1 ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "test.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done

jobs=$(nproc)
budget_s=1200
export LC_NUMERIC=C  # $EPOCHREALTIME with a decimal point
stage_names=() stage_secs=() stage_status=()
suite_start=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# One row per stage: its name, wall seconds and status, printed whether the suite passes or not.
print_stages() {
  local rc=$? i
  printf '\n==> stage timings (%s cores, load %s)\n' "$jobs" "$(cut -d' ' -f1-3 /proc/loadavg)"
  for i in "${!stage_names[@]}"; do
    printf '  %-62s %8.1f s  %s\n' "${stage_names[$i]}" "${stage_secs[$i]}" "${stage_status[$i]}"
  done
  local total
  total=$(elapsed "$suite_start")
  printf '  %-62s %8.1f s  %s\n' "total" "$total" "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
  # The budget (issue 56): 20 minutes on 2 cores, for the whole suite from a clean clone.
  # (The comparison in parentheses: a bare '>' in printf's arguments is awk's output redirection.)
  awk -v t="$total" -v b="$budget_s" 'BEGIN { d = t - b; printf "  %-62s %8d s  %s\n", "budget (20 min on 2 cores)", b,
    (d > 0 ? sprintf("%.0f s over", d) : sprintf("%.0f s to spare", -d)) }'
  print_slowest_modules
  print_disk "$rc"
}

# The e2e modules that cost the most, from the runs' JUnit reports: the seconds of their tests
# summed (tests run side by side, so this is each module's share of the workers, not wall time).
# A new slow test shows up here the day it lands.
print_slowest_modules() {
  local reports=() f
  for f in build/e2e-junit.xml build/e2e-alone-junit.xml; do [ -s "$f" ] && reports+=("$f"); done
  [ "${#reports[@]}" -gt 0 ] || return 0
  /usr/bin/python3 - "${reports[@]}" <<'PY' || true
import collections, sys, xml.etree.ElementTree as ET
cost, count = collections.Counter(), collections.Counter()
for path in sys.argv[1:]:
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "?").split(".")[-1]
        cost[module] += float(case.get("time") or 0)
        count[module] += 1
print("\n==> the five slowest e2e modules (seconds of their tests, summed)")
for module, secs in cost.most_common(5):
    print(f"  {module:<62} {secs:8.1f} s  {count[module]} tests")
PY
}

# The suite writes about 5 GiB (two builds, the e2e tests' temporary folders): a full disk shows up
# as hundreds of tests failing at setup, so the footer says how much room was left, and says it
# plainly when that is the likely cause of a failure.
print_disk() {
  local rc=$1 dir free_kib
  for dir in "$PWD" "${TMPDIR:-/tmp}"; do
    free_kib=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }') || continue
    [ -n "$free_kib" ] || continue
    printf '  %-62s %8.1f GiB free\n' "disk at $dir" "$(awk -v k="$free_kib" 'BEGIN { print k / 1048576 }')"
    if [ "$rc" != 0 ] && [ "$free_kib" -lt 1048576 ]; then
      printf '  the disk at %s is nearly full: tests fail at setup then; free some room (the suite needs about 5 GiB) and run it again\n' "$dir"
    fi
  done
}
trap 'print_stages; stop_background' EXIT

# stage NAME CMD...: runs CMD under a banner and records its time; a failure ends the suite.
# (set -e does not reach inside CMD here: the functions below chain their steps with &&.)
stage() {
  local name=$1 t0=$EPOCHREALTIME rc=0
  shift
  printf '\n==> %s\n' "$name"
  "$@" || rc=$?
  stage_names+=("$name")
  stage_secs+=("$(elapsed "$t0")")
  stage_status+=("$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")")
  return "$rc"
}

# background_stage NAME CMD...: starts CMD now, its output to a log, beside the stages that follow;
# finish_background waits for it, records its row (its own wall time) and shows its log on failure.
# The ASan build runs so beside the unit, comm and e2e stages, which mostly wait on processes.
bg_name="" bg_pid="" bg_t0="" bg_log=""
background_stage() {
  bg_name=$1 bg_t0=$EPOCHREALTIME bg_log=$2
  shift 2
  printf '\n==> %s (in the background: %s)\n' "$bg_name" "$bg_log"
  "$@" >"$bg_log" 2>&1 &
  bg_pid=$!
}
finish_background() {
  [ -n "$bg_pid" ] || return 0
  local rc=0
  printf '\n==> %s: waiting for it\n' "$bg_name"
  wait "$bg_pid" || rc=$?
  bg_pid=""
  stage_names+=("$bg_name (beside the stages above)")
  stage_secs+=("$(elapsed "$bg_t0")")
  stage_status+=("$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")")
  [ "$rc" = 0 ] || tail -n 80 "$bg_log"
  return "$rc"
}
stop_background() { [ -z "$bg_pid" ] || kill -- "$bg_pid" 2>/dev/null || true; }

format_check() {
  # Fix with: git ls-files '*.cpp' '*.h' '*.hpp' '*.c' | xargs clang-format -i
  git ls-files '*.cpp' '*.h' '*.hpp' '*.c' | xargs clang-format --dry-run --Werror
}
build() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build build -j"$jobs"
}
build_asan() {
  # The unit tests, and mltrain with its agent (and the comm runtime inside) sanitized too, for the
  # e2e tests in conftest's ASAN list.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMLTRAIN_SANITIZE=ON -DMLTRAIN_EMBED_AGENT=ON \
    -DMLTRAIN_SANITIZE_AGENT=ON >/dev/null &&
    cmake --build build-asan -j"$jobs" --target unit_tests mltrain
}
unit_asan() {
  # Each test's limit is 300 s here (tests/CMakeLists.txt): test_comm, the longest, took 48 s loaded.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -L unit --output-on-failure -j"$jobs"
}
e2e_asan() {
  # conftest points every sanitizer report of the launcher, its agents and the bench at a folder
  # per test and fails the test on any report.
  MLTRAIN_E2E_SANITIZED=1 MLTRAIN_BIN="$PWD/build-asan/mltrain" \
    /usr/bin/python3 -m pytest tests/e2e -q -p no:cacheprovider -m asan "$@"
}
e2e() {
  # Most tests wait on processes rather than compute: pytest-xdist runs them $workers at a time; the
  # cluster tests form one group, run in order on one worker (one cluster per machine). Tests
  # marked `alone` (they time the console or load the whole machine) run after, by themselves.
  local workers=$((jobs + 1))
  MLTRAIN_BIN="$PWD/build/mltrain" /usr/bin/python3 -m pytest tests/e2e -q -p no:cacheprovider \
    -n "$workers" --dist loadgroup -m "not alone" --junitxml="$PWD/build/e2e-junit.xml" "$@" &&
    MLTRAIN_BIN="$PWD/build/mltrain" /usr/bin/python3 -m pytest tests/e2e -q -p no:cacheprovider -m alone \
      --junitxml="$PWD/build/e2e-alone-junit.xml" "$@"
}

stage "dependencies" scripts/setup.sh --no-build --test-deps
stage "format check (clang-format)" format_check
stage "build (RelWithDebInfo)" build
stage "unit tests (ctest -L unit)" ctest --test-dir build -L unit --output-on-failure -j"$jobs"

if [ "$quick" = 1 ]; then
  stage "e2e smoke set (pytest -m smoke)" env MLTRAIN_BIN="$PWD/build/mltrain" /usr/bin/python3 -m pytest tests/e2e \
    -q -p no:cacheprovider -n "$((jobs + 1))" -m smoke "${pytest_args[@]}"
  exit 0
fi

if [ "$sanitize" = 1 ]; then
  background_stage "build (ASan+UBSan: unit tests, mltrain)" "$PWD/build/asan-build.log" build_asan
fi
stage "comm tier (ctest -L comm -LE unit)" ctest --test-dir build -L comm -LE unit --output-on-failure
if [ "$unit_only" = 0 ]; then
  stage "end-to-end tests (pytest tests/e2e)" e2e "${pytest_args[@]}"
fi
if [ "$sanitize" = 1 ]; then
  finish_background
  stage "unit tests under ASan+UBSan" unit_asan
  if [ "$unit_only" = 0 ]; then
    stage "e2e under ASan+UBSan (pytest -m asan)" e2e_asan "${pytest_args[@]}"
  fi
fi
