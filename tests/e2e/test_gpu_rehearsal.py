"""The GPU check's rehearsal (issue 38, docs/gpu.md): scripts/gpu-bundle.sh packages the build
MLTRAIN_BIN belongs to (no second build), and tests/gpu/run.sh runs from that bundle alone in a
clean environment (env -i: PATH and HOME only), the fakes of tests/fakes standing for NVML, cudart
and NCCL (NCCL laid out as the nvidia-nccl-cu13 wheel of a Python), to the end with every step
passed or skipped. The bundle is at most 48 MiB and its mltrain needs nothing from the system but
glibc, libstdc++ and libgcc."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

SYSTEM = re.compile(r"^(linux-vdso|(/lib64/)?ld-linux-x86-64|libc|libm|libpthread|libdl|librt|libresolv|"
                    r"libutil|libmvec|libstdc\+\+|libgcc_s)\.so")


def build_dir() -> Path:
    binary = Path(os.environ.get("MLTRAIN_BIN", REPO / "build" / "mltrain"))
    return (binary if binary.is_absolute() else REPO / binary).parent


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    build = build_dir()
    config = build / "generated" / "config.h"
    if not config.exists() or "MLTRAIN_HAVE_NCCL_HEADERS 1" not in config.read_text():
        pytest.skip(f"{build} was built without the CUDA/NCCL headers")
    for f in ("tests/nccl/mltrain-nccl-check", "tests/fakes/libnccl.so.2", "tests/fakes/libnvidia-ml.so.1"):
        if not (build / f).exists():
            pytest.skip(f"{build / f} is not built")
    out = tmp_path_factory.mktemp("gpu") / "gpu-bundle"
    r = subprocess.run([str(REPO / "scripts/gpu-bundle.sh"), "--from", str(build), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_bundle_is_small_and_needs_only_glibc_libstdcxx_libgcc(bundle):
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size <= 48 << 20, f"{size / 2**20:.1f} MiB"
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(bundle / "lib")}
    for binary in ("libexec/mltrain", "bin/mltrain-nccl-check", "bin/mltrain-nccl-bench", "lib/libmltrain-comm.so.0"):
        r = subprocess.run(["ldd", str(bundle / binary)], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        outside = [line.split()[0] for line in r.stdout.splitlines()
                   if line.strip() and str(bundle) not in line and not SYSTEM.match(line.split()[0])]
        assert not outside, f"{binary} needs from the system: {outside}\n{r.stdout}"
        assert "not found" not in r.stdout, r.stdout
    # The launcher starts from the bundle in a clean environment, not on the loader path.
    r = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", str(bundle / "bin/mltrain"), "--version"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("mltrain "), r.stdout + r.stderr


def test_rehearsal_runs_every_step_from_the_bundle_alone(bundle, tmp_path):
    out, home = tmp_path / "out", tmp_path / "home"
    home.mkdir()
    env = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", f"HOME={home}", f"OUT={out}",
           "MLTRAIN_GPU_REHEARSAL=1", f"MLTRAIN_BUNDLE={bundle}"]
    r = subprocess.run(env + [str(REPO / "tests/gpu/run.sh")], capture_output=True, text=True, timeout=240)
    summary = (out / "summary.txt").read_text() if (out / "summary.txt").exists() else r.stdout[-4000:]
    assert r.returncode == 0, summary + r.stderr[-2000:]
    assert f"mltrain from the bundle {bundle}" in summary, summary
    rows = dict(re.findall(r"^(\w+) +\d+s  (.*)$", summary, re.M))
    assert set(rows) == {"gpus", "doctor", "nccl", "bench", "torch", "top", "telemetry"}, summary
    assert all(v.startswith(("PASS", "SKIP")) for v in rows.values()), summary
    # NCCL was found where the wheel keeps it, and doctor said which file.
    assert re.search(r"nvidia/nccl/lib/libnccl.so.2 \((python |MLTRAIN_NCCL_LIBRARY)", rows["doctor"]), summary
    files = [f for f in out.rglob("*") if f.is_file()]
    assert len(files) <= 8, files
