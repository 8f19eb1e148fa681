#!/bin/bash
# The GPU bundle (issue 38, docs/gpu.md): mltrain, the NCCL check and bench tools and
# libmltrain-comm.so, stripped, with every shared library they need beyond glibc, libstdc++ and
# libgcc copied beside them, so a machine without Debian's dev packages (the GPU machine) runs them
# as they are. The fakes of the GPU libraries ride along in fakes/ for the rehearsal; nothing uses
# them unless told to.
#
# Usage: scripts/gpu-bundle.sh [--from BUILD_DIR] [--out DIR]
#   default: configure and build build-gpu (Release, -O2, against /usr/local/cuda's headers)
#   --from BUILD_DIR: package that build's targets as they are (CI's build/: no second build)
#   --out DIR: where the bundle goes (default gpu-bundle, ignored by git)
#
# The bundle:
#   bin/mltrain                      runs libexec/mltrain with the loader path set to lib/ for it alone
#   bin/mltrain-nccl-check, -bench   need only glibc and libstdc++ (the comm library is linked in)
#   lib/                             libmltrain-comm.so.0, libssh and the rest of the launcher's needs
#   fakes/                           libnccl.so.2, libcudart.so.13, libnvidia-ml.so.1, nvidia-smi
#   run CMD...                       CMD with bin/ first on PATH (tests/gpu/run.sh uses bin/ directly)
#   MANIFEST                         commit, build type, sizes, and what each binary needs
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
from="" out=gpu-bundle
while [ $# -gt 0 ]; do
  case $1 in
    --from) from=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu-bundle.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
max_mib=48
targets=(mltrain mltrain-nccl-check mltrain-nccl-bench mltrain_comm_shared fake_nvml fake_nccl fake_cudart)

if [ -z "$from" ]; then
  build=build-gpu
  # -O2, not Release's -O3: GCC 12's -O3 raises false -Wrestrict errors in std::string code.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELEASE=-O2 -DNDEBUG" -DMLTRAIN_CUDA_ROOT=/usr/local/cuda >/dev/null
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
else
  build=$from
fi
[ -d "$build" ] || { echo "gpu-bundle.sh: no build folder $build" >&2; exit 1; }
grep -q 'MLTRAIN_HAVE_NCCL_HEADERS 1' "$build/generated/config.h" || {
  echo "gpu-bundle.sh: $build was built without the CUDA/NCCL headers (/usr/local/cuda/include): its NCCL backend is a stub" >&2
  exit 1; }
need=("$build/mltrain" "$build/tests/nccl/mltrain-nccl-check" "$build/tests/nccl/mltrain-nccl-bench"
  "$build/comm/libmltrain-comm.so.0" "$build/tests/fakes/libnccl.so.2" "$build/tests/fakes/libcudart.so.13"
  "$build/tests/fakes/libnvidia-ml.so.1")
for f in "${need[@]}"; do
  [ -e "$f" ] || { echo "gpu-bundle.sh: $f is missing: build the targets ${targets[*]} in $build" >&2; exit 1; }
done

rm -rf "$out.tmp"
mkdir -p "$out.tmp"/{bin,libexec,lib,fakes}
install -m755 "$build/mltrain" "$out.tmp/libexec/mltrain"
install -m755 "$build/tests/nccl/mltrain-nccl-check" "$build/tests/nccl/mltrain-nccl-bench" "$out.tmp/bin/"
install -m755 "$(readlink -f "$build/comm/libmltrain-comm.so.0")" "$out.tmp/lib/libmltrain-comm.so.0"
for f in libnccl.so.2 libcudart.so.13 libnvidia-ml.so.1; do
  install -m755 "$(readlink -f "$build/tests/fakes/$f")" "$out.tmp/fakes/$f"
done
install -m755 "$repo/tests/fakes/nvidia-smi" "$repo/tests/fakes/nvidia-smi-query" "$out.tmp/fakes/"
strip --strip-all "$out.tmp/libexec/mltrain" "$out.tmp/bin/mltrain-nccl-check" "$out.tmp/bin/mltrain-nccl-bench"
strip --strip-unneeded "$out.tmp/lib/libmltrain-comm.so.0" "$out.tmp"/fakes/*.so.*

# What the system must provide: glibc, libstdc++, libgcc (and the kernel's vdso). Everything else
# the binaries need (ldd: the whole tree, libssh's GSSAPI and OpenSSL too) is copied beside them.
system_lib() {
  case $1 in
    linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|\
    libutil.so.*|libanl.so.*|libnsl.so.*|libnss_*|libmvec.so.*|libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}
for bin in "$out.tmp/libexec/mltrain" "$out.tmp"/bin/mltrain-nccl-* "$out.tmp/lib/libmltrain-comm.so.0"; do
  while read -r name _ path _; do
    system_lib "$name" && continue
    [ "$path" = "not" ] && { echo "gpu-bundle.sh: $bin needs $name, which is not found here" >&2; exit 1; }
    [ -e "$out.tmp/lib/$name" ] || install -m644 "$(readlink -f "$path")" "$out.tmp/lib/$name"
  done < <(ldd "$bin" | awk '/=>/ {print $1, $2, $3, $4}')
done
chmod 755 "$out.tmp"/lib/*.so* 2>/dev/null || true
strip --strip-unneeded "$out.tmp"/lib/*.so* 2>/dev/null || true

# The launcher through the loader with lib/ as its search path: set for mltrain alone, so the
# ranks it starts (Python, torch) never see the bundle's OpenSSL or zlib on LD_LIBRARY_PATH.
cat >"$out.tmp/bin/mltrain" <<'SH'
#!/bin/sh
b=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
exec /lib64/ld-linux-x86-64.so.2 --library-path "$b/lib" "$b/libexec/mltrain" "$@"
SH
cat >"$out.tmp/run" <<'SH'
#!/bin/sh
# Runs CMD with this bundle's bin/ first on PATH: `gpu-bundle/run mltrain doctor`.
b=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
PATH="$b/bin:$PATH" MLTRAIN_BUNDLE="$b" exec "$@"
SH
chmod 755 "$out.tmp/bin/mltrain" "$out.tmp/run"

{
  echo "commit $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "from $build ($(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt"))"
  echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  (cd "$out.tmp" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2)
  echo "libexec/mltrain needs from the system (the rest from lib/):"
  LD_LIBRARY_PATH="$out.tmp/lib" ldd "$out.tmp/libexec/mltrain" | grep -v "$out.tmp/lib/" |
    awk '{print "  " $1}' | sort -u
} >"$out.tmp/MANIFEST"

size_mib=$(( ($(du -sb "$out.tmp" | cut -f1) + 1048575) / 1048576 ))
if [ "$size_mib" -gt "$max_mib" ]; then
  echo "gpu-bundle.sh: the bundle is $size_mib MiB, over $max_mib MiB (see $out.tmp/MANIFEST)" >&2
  exit 1
fi
rm -rf "$out"
mv "$out.tmp" "$out"
echo "gpu-bundle.sh: $out: $size_mib MiB from $build"
