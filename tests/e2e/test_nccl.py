"""The NCCL backend on one host, against the fakes of libcudart and libnccl (tests/fakes): every
collective on device buffers through mltrain::comm against a host reference (4 ranks), `auto`
falling back to the CPU backend with one line, forced `nccl` refused clearly, an NCCL too old
refused, an injected asynchronous error named and aborted within the timeout, a killed rank.
The same across test-cluster hosts: test_multihost_nccl.py. On a real GPU: tests/gpu/run.sh."""
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from conftest import REPO

BUILD = Path(os.environ.get("MLTRAIN_BIN", REPO / "build" / "mltrain")).resolve().parent
FAKES = BUILD / "tests" / "fakes"
CHECK = BUILD / "tests" / "nccl" / "mltrain-nccl-check"

pytestmark = pytest.mark.skipif(
    not (FAKES / "libnccl.so.2").exists() or not CHECK.exists(),
    reason="built without the CUDA/NCCL headers: no NCCL backend and no fakes to test it with")


def fake_gpus(dest: Path, conf: str, libs=("libcudart.so.13", "libnccl.so.2", "libnvidia-ml.so.1")) -> Path:
    """The fakes copied to `dest` beside a fake-gpus.conf (the fakes read it from their folder)."""
    dest.mkdir(parents=True, exist_ok=True)
    for lib in libs:
        shutil.copy2(FAKES / lib, dest / lib)
    (dest / "fake-gpus.conf").write_text(conf)
    dest.chmod(0o755)
    for p in dest.iterdir():
        p.chmod(0o755)
    return dest


def spec(ml, libs: Path, n=4, args=(), backend="auto", gpus="per_proc = 1", env=None, name="job.toml"):
    extra = "".join(f'{k} = "{v}"\n' for k, v in (env or {}).items())
    argv = ", ".join(f'"{a}"' for a in [str(CHECK), *args])
    return ml.write(name, f"""
[run]
argv = [{argv}]
[run.env]
MLTRAIN_CUDART_LIBRARY = "{libs}/libcudart.so.13"
MLTRAIN_NCCL_LIBRARY = "{libs}/libnccl.so.2"
MLTRAIN_NVML_LIBRARY = "{libs}/libnvidia-ml.so.1"
{extra}
[cluster]
hosts = ["localhost:{n}"]
[comm]
backend = "{backend}"
[gpus]
{gpus}
""")


def test_every_collective_on_device_buffers_goes_through_nccl_and_is_right(ml, tmp_path):
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n")
    r = ml("run", spec(ml, libs), timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    # One line from rank 0 says which backend and why.
    lines = re.findall(r"mltrain-comm: backend .*", r.stdout + r.stderr)
    assert lines == ["mltrain-comm: backend nccl: every rank has its own GPU and NCCL 2.28.9 loads"], lines
    ok = re.findall(r"rank (\d): all results correct, #wrong 0", r.stdout)
    assert sorted(ok) == ["0", "1", "2", "3"], r.stdout[-3000:]
    table = [l for l in r.stdout.splitlines() if "#wrong" in l and "rank 0 " in l]
    # Every collective, dtype and op ran on device buffers, and host buffers still work beside.
    for coll in ("allreduce", "broadcast(0)", "broadcast(n-1)", "allgather", "reduce_scatter", "allreduce-host"):
        assert any(f" {coll} " in l for l in table), coll
    for dt in ("f32", "f64", "f16", "bf16", "i32", "i64", "u8"):
        for op in ("sum", "prod", "min", "max", "avg"):
            assert any(re.search(rf" allreduce +{dt} +{op} ", l) for l in table), (dt, op)


def test_auto_falls_back_to_the_cpu_backend_with_one_line_when_nccl_does_not_load(ml, tmp_path):
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n", libs=("libcudart.so.13", "libnvidia-ml.so.1"))
    r = ml("run", spec(ml, libs, args=["--backend-only"]), timeout=60)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    out = r.stdout + r.stderr
    lines = re.findall(r"mltrain-comm: backend .*", out)
    assert len(lines) == 1, out
    assert lines[0].startswith("mltrain-comm: backend tcp (CPU): rank 0 (") and "NCCL not found (" in lines[0], lines
    assert "libnccl.so.2" in lines[0], lines
    assert len(re.findall(r"rank \d backend tcp: rank 0 \(", r.stdout)) == 4, r.stdout


def test_forced_nccl_without_nccl_fails_preflight_clearly(ml, tmp_path):
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n", libs=("libcudart.so.13", "libnvidia-ml.so.1"))
    r = ml("run", spec(ml, libs, args=["--backend-only"], backend="nccl"), timeout=60)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    # Preflight: nothing starts, the host is named, and so is what is missing.
    assert "preflight failed on 1 of 1 host; no rank was started:" in out, out[-3000:]
    assert re.search(r'localhost: \[comm\] backend = "nccl", but NCCL does not load here \(\S*libnccl\.so\.2: '
                     r'cannot open shared object file', out), out[-3000:]
    assert 'or use backend = "auto" to fall back to the CPU backend' in out, out[-3000:]
    assert "backend nccl" not in out and "rank 0 backend" not in out, out[-3000:]


def test_two_ranks_on_one_gpu_use_the_cpu_backend_with_auto(ml, tmp_path):
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n")
    r = ml("run", spec(ml, libs, n=2, args=["--backend-only"], gpus="procs_per_gpu = 2"), timeout=60)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    lines = re.findall(r"mltrain-comm: backend .*", r.stdout + r.stderr)
    assert len(lines) == 1 and lines[0].startswith("mltrain-comm: backend tcp (CPU): ranks 0 and 1 ("), lines
    assert "share GPU 00000000:18:00.0" in lines[0] and "NCCL refuses two ranks" in lines[0], lines


def test_an_nccl_older_than_supported_is_refused_with_its_version(ml, tmp_path):
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n* nccl_version 21205\n")
    r = ml("run", spec(ml, libs, n=2, args=["--backend-only"], backend="nccl"), timeout=60)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert f"NCCL 2.12.5 at {libs}/libnccl.so.2 is older than 2.13.0, the oldest mltrain supports" in out, out[-3000:]
    assert "no rank was started" in out, out[-3000:]
    # auto: the same reason, one line, and the job runs on the CPU backend.
    r = ml("run", spec(ml, libs, n=2, args=["--backend-only"], name="auto.toml"), timeout=60)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert re.findall(r"mltrain-comm: backend tcp \(CPU\): rank 0 \(.*older than 2\.13\.0", r.stdout + r.stderr)


def test_an_async_nccl_error_is_named_and_every_rank_aborts_within_the_timeout(ml, tmp_path):
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n* async_error_rank 2\n* async_error_after 5\n")
    t0 = time.monotonic()
    r = ml("run", spec(ml, libs, args=["--loop", "1000"], env={"MLTRAIN_COMM_TIMEOUT": "20s"}), timeout=120)
    took = time.monotonic() - t0
    assert r.returncode != 0
    out = r.stdout + r.stderr
    # The rank that failed names the NCCL call and what NCCL said; it is the one mltrain names first.
    assert re.search(r"mltrain-comm: rank 2 \([^)]*\): allreduce #\d+: NCCL ncclAllReduce: "
                     r"unhandled system error.*injected async error", out), out[-4000:]
    assert "mltrain: first failure: rank 2 on localhost: exit code 1" in out, out[-3000:]
    # Well within the 20 s comm timeout: the error was seen, not waited out.
    assert took < 20, took


def test_a_killed_rank_makes_the_others_fail_fast_naming_it(ml, tmp_path):
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n")
    marker = ml.marker()
    prog = ml.write("kill2.sh", f"""#!/bin/sh
if [ "$RANK" = 1 ]; then (sleep 1.{marker}; kill -9 $$) & fi
exec {CHECK} --loop 100000000
""")
    prog.chmod(0o755)
    job = ml.write("k.toml", spec(ml, libs).read_text().replace(f'argv = ["{CHECK}", ]', f'argv = ["{prog}"]')
                   .replace(f'argv = ["{CHECK}"]', f'argv = ["{prog}"]'))
    r = ml("run", job, "--env", "MLTRAIN_COMM_TIMEOUT=60s", timeout=120)
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert re.search(r"rank 1\b.*(SIGKILL|signal 9|killed)", out), out[-3000:]


def run_ranks(tmp_path, libs, n, args, env=None, timeout=60):
    """n rank processes of the checker, started directly (no launcher to stop the others)."""
    import socket
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(n):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), MLTRAIN_STORE_ADDR=f"127.0.0.1:{port}",
                 MLTRAIN_TOKEN="t", CUDA_VISIBLE_DEVICES=str(r), MLTRAIN_CUDART_LIBRARY=f"{libs}/libcudart.so.13",
                 MLTRAIN_NCCL_LIBRARY=f"{libs}/libnccl.so.2", **(env or {}))
        log = open(tmp_path / f"rank-{r}.log", "w")
        procs.append((subprocess.Popen([str(CHECK), *args], env=e, stdout=log, stderr=subprocess.STDOUT), log))
    return procs


def test_without_a_launcher_the_other_ranks_name_the_rank_whose_nccl_failed(tmp_path):
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n* async_error_rank 2\n* async_error_after 5\n")
    procs = run_ranks(tmp_path, libs, 4, ["--loop", "1000"], env={"MLTRAIN_COMM_TIMEOUT": "30s"})
    t0 = time.monotonic()
    codes = [p.wait(timeout=60) for p, _ in procs]
    took = time.monotonic() - t0
    assert codes == [1, 1, 1, 1], codes
    assert took < 15, took  # seen and aborted, not waited out
    logs = [(tmp_path / f"rank-{r}.log").read_text() for r in range(4)]
    assert "rank 2 (" in logs[2] and "injected async error (fake-gpus.conf)" in logs[2], logs[2]
    for r in (0, 1, 3):
        assert re.search(rf"rank {r} \(.*\): allreduce #\d+: NCCL ncclAllReduce: remote process exited or there "
                         r"was a network error \(rank 2 ", logs[r]), logs[r]
    # Through the store, the first failure and its cause (best effort: rank 0 hosts the store and
    # may exit before a peer asks).
    assert re.search(r"first failure: rank 2 \(.*injected async error", logs[0] + logs[1] + logs[3]), logs


def test_a_stopped_rank_makes_the_others_abort_nccl_at_the_timeout(tmp_path):
    import signal
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n")
    procs = run_ranks(tmp_path, libs, 3, ["--loop", "100000000"], env={"MLTRAIN_COMM_TIMEOUT": "3s"})
    try:
        deadline = time.monotonic() + 30
        while "allreduce 10 done" not in (tmp_path / "rank-1.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "rank-1.log").read_text()
            time.sleep(0.05)
        procs[1][0].send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        codes = [procs[r][0].wait(timeout=30) for r in (0, 2)]
        took = time.monotonic() - t0
    finally:
        procs[1][0].kill()
        procs[1][0].wait()
    assert codes == [1, 1], codes
    assert 2.5 < took < 15, took
    # The first to time out aborts; the other either times out too or sees that abort as a remote error.
    logs = [(tmp_path / f"rank-{r}.log").read_text() for r in (0, 2)]
    timed_out = [bool(re.search(r"NCCL ncclAllReduce did not complete within 3 s \(MLTRAIN_COMM_TIMEOUT\): a rank "
                                r"stopped or the network is cut; the NCCL communicator was aborted", log))
                 for log in logs]
    assert any(timed_out), logs
    for log, t in zip(logs, timed_out):
        assert t or "remote process exited or there was a network error" in log, log


def test_mltrain_bench_backend_nccl_runs_on_device_buffers_and_checks_results(ml, tmp_path):
    libs = fake_gpus(tmp_path / "gpu", "* gpus 4\n")
    env = {"MLTRAIN_CUDART_LIBRARY": f"{libs}/libcudart.so.13", "MLTRAIN_NCCL_LIBRARY": f"{libs}/libnccl.so.2"}
    for op in ("allreduce", "allgather"):
        r = ml("bench", "-n", "4", "--backend", "nccl", "--op", op, "-b", "4K", "-e", "1M", "-f", "16", "--check",
               "--iters", "3", "--warmup", "1", env=env, timeout=120)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        assert "# NCCL 2.28.9 on GPU 00000000:18:00.0; buffers in device memory" in r.stdout, r.stdout
        rows = [l.split() for l in r.stdout.splitlines() if l.strip() and not l.startswith("#")
                and not l.startswith("mltrain")]
        assert len(rows) == 3 and all(row[-1] == "0" for row in rows), r.stdout
    # Without a GPU the bench says so instead of running on the host.
    r = ml("bench", "-n", "2", "--backend", "nccl", "-b", "4K", "-e", "4K", timeout=60,
           unset=("MLTRAIN_CUDART_LIBRARY", "MLTRAIN_NCCL_LIBRARY"))
    assert r.returncode != 0
    assert "--device (mltrain bench --backend nccl) needs a GPU: no NVIDIA driver (/dev/nvidiactl missing)" in \
        r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]


# Forced `[comm] backend = "nccl"` on a host where NCCL loads but there is no GPU or driver fails
# preflight, naming the host, before any rank starts.
def test_forced_nccl_without_a_driver_fails_preflight(ml, tmp_path):
    libs = FAKES
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
