"""What a new user hits, round 2 (issue 33): messages and checks on one host.

- item 12: every unknown key of a spec at once, in file order (not one per run, not [cluster]
  before [run]).
- item 6: forced `[comm] backend = "nccl"` on a host where NCCL loads but there is no GPU or driver
  fails preflight, naming the host, before any rank starts.

Run: MLTRAIN_BIN=$PWD/build/mltrain /usr/bin/python3 -m pytest tests/e2e/test_newcomer_messages.py -q -p no:cacheprovider
"""
import os
from pathlib import Path

import pytest

from gpu_fakes import build_dir


# ---- item 12 -------------------------------------------------------------------------------------

TYPOS = """\
name = "typos"
[run]
comand = "echo hi"
max_restart = 2
[cluster]
hsts = ["localhost"]
[gpus]
per_prc = 1
"""


@pytest.mark.parametrize("sub", ["validate", "run"])
def test_every_unknown_key_at_once_in_file_order(ml, sub):
    ml.write("job.toml", TYPOS)
    r = ml(sub, "job.toml")
    assert r.returncode == 2, r.stderr
    err = r.stderr
    wanted = ["job.toml:3:1: unknown key 'comand' in [run] (did you mean 'command'?)",
              "job.toml:4:1: unknown key 'max_restart' in [run] (did you mean 'max_restarts'?)",
              "job.toml:6:1: unknown key 'hsts' in [cluster] (did you mean 'hosts'?)",
              "job.toml:8:1: unknown key 'per_prc' in [gpus] (did you mean 'per_proc'?)"]
    at = [err.find(w) for w in wanted]
    assert all(a >= 0 for a in at), err
    assert at == sorted(at), err
    assert "4 problems" in err and "hint: see docs/spec.md" in err, err


def test_one_typo_is_still_one_line(ml):
    ml.write("job.toml", '[run]\ncommand = "true"\ntimeot = "1m"\n')
    r = ml("validate", "job.toml")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0].endswith("job.toml:3:1: unknown key 'timeot' in [run] (did you mean 'timeout'?)")


def test_a_typo_and_a_wrong_value_together(ml):
    ml.write("job.toml", '[run]\ncommand = "true"\ncomand = "x"\n[cluster]\nnprocs = "two"\n')
    r = ml("validate", "job.toml")
    assert r.returncode == 2
    assert "2 problems" in r.stderr, r.stderr
    assert r.stderr.find("'comand'") < r.stderr.find("'nprocs' must be an integer"), r.stderr


# ---- item 6 --------------------------------------------------------------------------------------

def fake_nccl_dir(tmp_path: Path) -> Path:
    src = build_dir() / "libnccl.so.2"
    if not src.exists():
        pytest.skip(f"the fake NCCL library is not built in {src.parent} (build the fake_nccl target)")
    return src.parent


def test_forced_nccl_without_a_driver_fails_preflight(ml, tmp_path):
    libs = fake_nccl_dir(tmp_path)
    marker = tmp_path / "a-rank-started"
    ml.write("job.toml", f"""
[run]
command = "touch {marker}"
[run.env]
MLTRAIN_NCCL_LIBRARY = "{libs}/libnccl.so.2"
MLTRAIN_NVML_LIBRARY = "{tmp_path}/no-such-libnvidia-ml.so.1"
[cluster]
hosts = ["localhost:2"]
[comm]
backend = "nccl"
""")
    # No nvidia-smi on PATH either: the host has no driver at all.
    r = ml("run", "job.toml", env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert r.returncode != 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert 'localhost: [comm] backend = "nccl" needs a GPU per rank, and this host has none' in out, out
    # Why it has none: what the GPU probe tried.
    assert "no-such-libnvidia-ml.so.1" in out and "nvidia-smi not in PATH" in out, out
    assert not marker.exists(), "a rank started although preflight should have failed"
