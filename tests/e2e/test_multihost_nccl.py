"""The NCCL backend across test-cluster hosts (tests/cluster/), against the fakes of libcudart and
libnccl (tests/fakes): 2 hosts x 2 ranks bootstrap through the job's store and every collective
on device buffers is right; NCCL absent on one host makes `auto` fall back with one line naming
that host and forced `nccl` fail naming it; an injected async error on h2 is named. Ranks run as
the cluster's login user; the fakes and the checker live in mh.shared. One host: test_nccl.py."""
import re
import shutil

import pytest

from multihost_fixtures import cluster, mh, shared_root  # noqa: F401
from test_nccl import CHECK, FAKES, fake_gpus

pytestmark = pytest.mark.skipif(
    not (FAKES / "libnccl.so.2").exists() or not CHECK.exists(),
    reason="built without the CUDA/NCCL headers: no NCCL backend and no fakes to test it with")


def job(mh, libs, *, nccl_lib=None, args=(), backend="auto", env=None, name="job.toml"):
    check = mh.shared / "mltrain-nccl-check"
    if not check.exists():
        shutil.copy2(CHECK, check)
        check.chmod(0o755)
    extra = "".join(f'{k} = "{v}"\n' for k, v in (env or {}).items())
    argv = ", ".join(f'"{a}"' for a in [str(check), *args])
    path = mh.shared / name
    path.write_text(f"""
[run]
argv = [{argv}]
workdir = "/tmp"
[run.env]
MLTRAIN_CUDART_LIBRARY = "{libs}/libcudart.so.13"
MLTRAIN_NCCL_LIBRARY = "{nccl_lib or f'{libs}/libnccl.so.2'}"
MLTRAIN_NVML_LIBRARY = "{libs}/libnvidia-ml.so.1"
MLTRAIN_COMM_TIMEOUT = "30s"
{extra}
[cluster]
hosts = ["h1:2", "h2:2"]
[comm]
backend = "{backend}"
[gpus]
per_proc = 1
""")
    path.chmod(0o644)
    return path


def test_four_ranks_on_two_hosts_bootstrap_and_every_collective_is_right(mh, cluster):
    libs = fake_gpus(mh.shared / "gpu", "* gpus 4\n")
    r = mh.run(job(mh, libs), timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    out = r.stdout + r.stderr
    assert re.findall(r"mltrain-comm: backend .*", out) == [
        "mltrain-comm: backend nccl: every rank has its own GPU and NCCL 2.28.9 loads"], out[-3000:]
    ok = re.findall(r"\[(h\d):(\d)\] rank \d: all results correct, #wrong 0", r.stdout)
    assert sorted(ok) == [("h1", "0"), ("h1", "1"), ("h2", "2"), ("h2", "3")], r.stdout[-3000:]


def nccl_on_h1_only(cluster, libs):
    """libnccl.so.2 (and its conf) in h1's private /dev/shm: h2 has no NCCL at that path."""
    d = "/dev/shm/mltrain-test-nccl"
    cluster.run("h1", f"mkdir -p {d} && cp {libs}/libnccl.so.2 {libs}/fake-gpus.conf {d}/ && chmod -R a+rX {d}",
                check=True)
    cluster.run("h2", f"rm -rf {d}", check=True)
    return f"{d}/libnccl.so.2"


def test_auto_falls_back_with_one_line_naming_the_host_without_nccl(mh, cluster):
    libs = fake_gpus(mh.shared / "gpu", "* gpus 4\n")
    nccl = nccl_on_h1_only(cluster, libs)
    r = mh.run(job(mh, libs, nccl_lib=nccl, args=["--backend-only"]), timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    lines = re.findall(r"mltrain-comm: backend .*", r.stdout + r.stderr)
    assert len(lines) == 1, r.stdout + r.stderr
    assert lines[0].startswith("mltrain-comm: backend tcp (CPU): rank 2 (h2): NCCL not found ("), lines
    assert nccl in lines[0], lines

    # Forced: preflight fails on h2, naming it and why; nothing starts.
    r = mh.run(job(mh, libs, nccl_lib=nccl, args=["--backend-only"], backend="nccl", name="forced.toml"),
               timeout=120)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "preflight failed on 1 of 2 hosts; no rank was started:" in out, out[-3000:]
    assert f'h2: [comm] backend = "nccl", but NCCL does not load here ({nccl}: cannot open shared object file' \
        in out, out[-3000:]


def test_an_async_error_on_h2_is_named_and_the_job_stops(mh, cluster):
    libs = fake_gpus(mh.shared / "gpu", "* gpus 4\n* async_error_rank 3\n* async_error_after 4\n")
    r = mh.run(job(mh, libs, args=["--loop", "1000"]), timeout=120)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert re.search(r"rank 3 \(h2\): allreduce #\d+: NCCL ncclAllReduce: unhandled system error.*injected", out), \
        out[-4000:]
