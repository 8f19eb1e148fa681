"""The fake NVML and nvidia-smi (tests/fakes/, README "NVML") for end-to-end tests of GPU
inventory and assignment on machines without a GPU.

The build puts them in <build>/tests/fakes/ (beside the mltrain binary MLTRAIN_BIN names;
MLTRAIN_FAKES_DIR overrides). `install(dest, conf)` copies them into a folder of the test's own
with a fake-gpus.conf, so each test says what its hosts have; a job selects the fake library with
MLTRAIN_NVML_LIBRARY and the fake nvidia-smi through its PATH.
"""
import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO

NAME = "NVIDIA H100 80GB HBM3"


def build_dir() -> Path:
    if os.environ.get("MLTRAIN_FAKES_DIR"):
        return Path(os.environ["MLTRAIN_FAKES_DIR"])
    binary = Path(os.environ.get("MLTRAIN_BIN", REPO / "build" / "mltrain"))
    if not binary.is_absolute():
        binary = REPO / binary
    return binary.parent / "tests" / "fakes"


def install(dest: Path, conf: str) -> Path:
    """Copies libnvidia-ml.so.1, nvidia-smi and nvidia-smi-query into `dest` beside a fake-gpus.conf holding `conf`
    (lines "HOST KEY VALUE", HOST a host name or '*'); returns `dest`. Skips the test when the
    fakes were not built."""
    src = build_dir()
    lib, smi, query = src / "libnvidia-ml.so.1", src / "nvidia-smi", src / "nvidia-smi-query"
    if not lib.exists() or not smi.exists() or not query.exists():
        pytest.skip(f"the fake GPU libraries are not built in {src} (build the fake_nvml target)")
    dest.mkdir(parents=True, exist_ok=True)
    for f in (lib, smi, query):
        shutil.copy2(f, dest / f.name)
        (dest / f.name).chmod(0o755)
    (dest / "fake-gpus.conf").write_text(conf)
    (dest / "fake-gpus.conf").chmod(0o644)
    return dest


def fnv1a(text: str) -> int:
    h = 2166136261
    for c in text.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return h


def uuid(host: str, index: int) -> str:
    """The UUID the fakes give GPU `index` of `host` (fake_gpu_uuid in tests/fakes/fake_conf.c)."""
    return f"GPU-{fnv1a(host):08x}-0000-4000-8000-{index:012x}"
