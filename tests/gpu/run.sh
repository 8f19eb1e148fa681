#!/bin/bash
# On a machine with NVIDIA GPUs: build mltrain, check the NCCL backend's results for every
# collective x op x dtype against a host reference, bench allreduce through mltrain against a
# raw NCCL loop on the same device buffers, and show the GPU inventory. Exits 0 with one line
# where no GPU is present. Usage: tests/gpu/run.sh [BUILD_DIR]   (default: build-gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: skipped: no GPU here (nvidia-smi -L fails or is missing)"
  exit 0
fi
echo "== GPUs"
nvidia-smi -L
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader

echo "== build ($build)"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then scripts/setup.sh --no-build; fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target mltrain mltrain-nccl-check mltrain-nccl-bench
grep -q 'MLTRAIN_HAVE_NCCL_HEADERS 1' "$build/generated/config.h" || {
  echo "built without the NCCL headers (no $build/../cuda?): cannot test the backend"; exit 1; }
ml="$build/mltrain"
gpus=$(nvidia-smi -L | grep -c '^GPU ')
export MLTRAIN_HOME=$(mktemp -d)

echo "== mltrain doctor"
"$ml" doctor || true

echo "== NCCL correctness: every collective x op x dtype, $gpus rank(s), one GPU each"
job=$(mktemp --suffix=.toml)
cat > "$job" <<TOML
[run]
argv = ["$PWD/$build/tests/nccl/mltrain-nccl-check"]
[cluster]
hosts = ["localhost:$gpus"]
[comm]
backend = "nccl"
[gpus]
per_proc = 1
TOML
"$ml" run "$job" 2>&1 | grep -E 'backend|#wrong [1-9]|all results correct|FAILED|rank 0 .*allreduce +f32 +sum +1048579' || true
"$ml" run "$job" >/dev/null 2>&1 && echo "correctness: PASS" || { echo "correctness: FAIL"; exit 1; }

echo "== allreduce through mltrain vs raw NCCL, same device buffers (ratio = mltrain / raw)"
sed -i "s|mltrain-nccl-check\"|mltrain-nccl-bench\", \"-b\", \"1M\", \"-e\", \"1G\", \"-f\", \"4\"|" "$job"
"$ml" run "$job" 2>&1 | sed -n 's/^\[0\] //p'

echo "== mltrain bench (CPU path, for reference)"
"$ml" bench -n "$gpus" -b 1M -e 64M -f 8 || true

echo "== mltrain top --once, while the NCCL check runs on every GPU"
"$ml" run -d "$job" >/dev/null 2>&1 || true
sleep 3
"$ml" top --once || true
"$ml" top --once --json | head -60 || true
"$ml" stop latest >/dev/null 2>&1 || true

echo "== what telemetry sampling costs the agent with the real NVML"
GPUS=real RANKS="$gpus" MLTRAIN_BIN="$ml" bench/telemetry_cost.sh 3 10 || true
