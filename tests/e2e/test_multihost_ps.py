"""Parameter-server mode on the 4-host test cluster (tests/cluster/): workers on h1 and h2, PS servers
in the agents of the server-only hosts h3 and h4 ([ps] hosts). The must-holds of issue 13: sync
exactness for integer dtypes at sizes below, at and above partition_bytes over 100 rounds (every
server used); the DDP ps_hook run ending with identical weights; the async example converging on 3
hosts; a server host's agent or a worker SIGKILLed mid-run failing the job at once, named, with
nothing left on any host; `mltrain bench --mode ps`. Ranks run as the cluster's login user; worker
scripts live in mh.shared. The same on one host: test_python_ps.py."""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import REPO, pids_with_arg, wait_for
from multihost_fixtures import (  # noqa: F401  (fixtures are used by name)
    LineReader, cluster, host_of_pid, mh, python_has_torch, shared_root)

PY = "/usr/bin/python3"
HAS_TORCH, WHY_NOT = python_has_torch(PY)
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason=WHY_NOT)

HOSTS = ("h1", "h2", "h3", "h4")
PARTITION = 4096  # bytes: small, so that modest keys split into parts over the servers

# One worker. `exact ROUNDS`: every key (int32, int64, uint8; 1 element, one below, at, one above
# and 3 parts + 5 elements of the partition) push_pulled ROUNDS times, blocking and in flight, each
# element checked against the sum of every worker's round-r push. `loop MARKER SECONDS READY_DIR`:
# push_pull a key spread over every server until SECONDS have passed (for the kill tests).
WORKER = r'''
import os, sys, time
import numpy as np
import mltrain.ps as ps

mode = sys.argv[1]
c = ps.init()
me, n = ps.worker(), ps.num_workers()
PART = int(os.environ["MLTRAIN_PS_PARTITION_BYTES"])
print("PS-INFO", me, n, ps.num_servers(), int(ps.is_sync()), PART, flush=True)

if mode == "exact":
    rounds = int(sys.argv[2])
    # Worker- and round-distinct values, signed, beyond 32 bits for int64; every sum fits its dtype.
    SCALE = {"int32": 1 << 24, "int64": 1 << 33}

    def pushed(dt, w, r, count):
        i = np.arange(count, dtype=np.int64)
        if dt == "uint8":
            return (i * 7 + w * 3 + r * 5) % 50
        return i * 7 - r * 1009 + w * SCALE[dt] + (w + 1) * (r + 1) * 3

    cases = []
    for dt in ("int32", "int64", "uint8"):
        per = PART // np.dtype(dt).itemsize
        for count in (1, per - 1, per, per + 1, 3 * per + 5):
            cases.append((dt, count, f"{dt}/{count}"))
    for dt, count, key in cases:
        ps.declare(key, np.zeros(count, dt))

    checks = 0

    def check(what, got, dt, r, count):
        global checks
        want = sum(pushed(dt, w, r, count) for w in range(n)).astype(dt)
        if got.dtype != np.dtype(dt) or got.shape != want.shape or not (got == want).all():
            bad = np.flatnonzero(got != want)
            i = int(bad[0]) if len(bad) else -1
            raise SystemExit(f"PS-EXACT-WRONG worker {me}: {what}: {len(bad)} wrong elements, "
                             f"first {i}: got {got[i]}, want {want[i]}")
        checks += 1

    for r in range(rounds):
        if r % 2 == 0:  # blocking, in place
            for dt, count, key in cases:
                x = pushed(dt, me, r, count).astype(dt)
                check(f"{key} round {r} push_pull", ps.push_pull(key, x), dt, r, count)
        else:  # every key in flight at once
            flights = []
            for dt, count, key in cases:
                x = pushed(dt, me, r, count).astype(dt)
                out = np.zeros(count, dt)
                flights.append((dt, count, key, ps.push_pull_async(key, x, out=out)))
            for dt, count, key, h in flights:
                check(f"{key} round {r} push_pull_async", h.wait(), dt, r, count)
    print("PS-EXACT-OK", me, checks, len(cases), rounds, flush=True)
elif mode == "loop":
    marker, seconds, ready = sys.argv[2], float(sys.argv[3]), sys.argv[4]
    count = 3 * PART // 4 + 5  # float32: 4 parts, one on each of 4 servers
    x = np.ones(count, np.float32)
    ps.declare("loop", x)
    t0, r = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        x[:] = 1
        ps.push_pull("loop", x)
        assert float(x[0]) == n, x[0]
        if r == 0:
            print("PS-LOOP-RUNNING", me, flush=True)
            open(os.path.join(ready, f"ready-{me}"), "w").close()
        r += 1
    print("PS-LOOP-DONE", me, r, flush=True)
'''


def worker_script(mh):
    p = mh.shared / "ps_worker.py"
    p.write_text(WORKER)
    p.chmod(0o644)
    return p


def spec(mh, name, argv, *, workers='["h1:2", "h2:2"]', servers='["h3", "h4"]', servers_per_host=2,
         sync=True, partition=PARTITION, env=None, extra=""):
    env = {"OMP_NUM_THREADS": "1", **(env or {})}
    argv_toml = ", ".join(f'"{a}"' for a in argv)
    env_toml = "".join(f'{k} = "{v}"\n' for k, v in env.items())
    return mh.ml.write(f"{name}.toml", f'''
name = "{name}"
[run]
argv = [{argv_toml}]
workdir = "/tmp"
timeout = "4m"
[run.env]
{env_toml}
[cluster]
hosts = {workers}
[ps]
hosts = {servers}
servers_per_host = {servers_per_host}
sync = {"true" if sync else "false"}
partition_bytes = {partition}
{extra}''')


def lines_of(out, word):
    """'[h1:0] WORD a b c' lines -> [(host, rank, [a, b, c])]."""
    return [(m[1], int(m[2]), m[3].split()) for m in re.finditer(
        rf"^\[(\w+):(\d+)\] {word}\b(.*)$", out, re.M)]


# -- what runs on the hosts ------------------------------------------------------------------------

def host_pids(cluster):
    return {h: set(cluster.pids(h)) for h in HOSTS}


def _comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip() or f"({_comm(pid)})"
    except OSError:
        return "(gone)"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def agents_on(cluster, h, before=()):
    return sorted(p for p in cluster.pids(h)
                  if p not in before and (_comm(p) or "").startswith("mltrain-agent") and _alive(p))


def new_on_hosts(cluster, before):
    """Live processes in a host's namespace that were not there before the run: {host: [cmdline]}."""
    left = {}
    for h in HOSTS:
        new = [p for p in cluster.pids(h) if p not in before[h] and _alive(p)]
        if new:
            left[h] = [f"{p}: {_cmdline(p)}" for p in new]
    return left


def assert_nothing_left(cluster, before, marker, within_s=10.0):
    """No worker (carrying `marker`), no agent, no ssh session of the run on any host."""
    deadline = time.monotonic() + within_s
    while True:
        left = new_on_hosts(cluster, before)
        workers = pids_with_arg(marker)
        if (not left and not workers) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    assert not workers, f"workers of the run still alive {within_s:.0f} s after the launcher ended: " \
        f"{[(p, host_of_pid(p), _cmdline(p)) for p in workers]}"
    assert not left, f"processes of the run left on the hosts {within_s:.0f} s after the launcher ended: {left}"


# --- 1. sync exactness: 4 workers on 2 hosts x 2 server hosts ----------------------------------------

@pytest.mark.parametrize("servers_per_host", [2, 1])
def test_sync_push_pull_exact_for_integers_over_100_rounds(mh, servers_per_host):
    rounds = 100
    script = worker_script(mh)
    r = mh.run(spec(mh, "ps-exact", [PY, script, "exact", rounds], servers_per_host=servers_per_host),
               timeout=240)
    out = r.stdout
    assert r.returncode == 0, (out + r.stderr)[-4000:]
    assert "PS-EXACT-WRONG" not in out, out[-3000:]
    servers = 2 * servers_per_host
    info = lines_of(out, "PS-INFO")
    assert sorted((h, k) for h, k, _ in info) == [("h1", 0), ("h1", 1), ("h2", 2), ("h2", 3)], out[-3000:]
    for _, k, f in info:
        assert f == [str(k), "4", str(servers), "1", str(PARTITION)], info
    oks = lines_of(out, "PS-EXACT-OK")
    assert sorted(k for _, k, _ in oks) == [0, 1, 2, 3], out[-3000:]
    for _, k, f in oks:
        # 3 dtypes x 5 sizes, one check per key per round
        assert f == [str(k), str(15 * rounds), "15", str(rounds)], oks

    rec = mh.show()
    ps_servers = rec.get("ps_servers") or []
    assert sorted(s["server"] for s in ps_servers) == list(range(servers)), ps_servers
    assert {s["host"] for s in ps_servers} == {"h3", "h4"}, ps_servers
    for s in ps_servers:
        # No hot spot: every server took part in the rounds (partitioned keys spread over all).
        assert s["bytes_in"] > 0 and s["bytes_out"] > 0 and s["requests"] > 0 and s["keys"] > 0, ps_servers
    by_host = {h: sum(s["bytes_in"] for s in ps_servers if s["host"] == h) for h in ("h3", "h4")}
    assert all(v > 0 for v in by_host.values()), by_host
    # `mltrain show` prints them in its SERVER table.
    show = mh.ml("show", "latest")
    assert show.returncode == 0, show.stderr
    table = show.stdout[show.stdout.index("\nSERVER "):].split("\n\n")[0] if "\nSERVER " in show.stdout else ""
    rows = re.findall(r"^(\d+) +(h\d) ", table, re.M)
    assert sorted((int(k), h) for k, h in rows) == sorted((s["server"], s["host"]) for s in ps_servers), \
        show.stdout
    # The servers' logs are the run's records.
    run_dir = mh.latest_run_dir()
    for h in ("h3", "h4"):
        assert (run_dir / f"ps-{h}.log").is_file(), sorted(p.name for p in run_dir.iterdir())


# --- 2. DDP through the servers ---------------------------------------------------------------------

@needs_torch
def test_ddp_ps_hook_identical_weights_on_every_worker(mh):
    script = mh.shared / "ddp_ps.py"
    shutil.copy(REPO / "examples/ps/ddp_ps.py", script)
    script.chmod(0o644)
    r = mh.run(spec(mh, "ddp-ps", [PY, script, "--steps", "20"], partition=262144), timeout=300)
    out = r.stdout
    assert r.returncode == 0, (out + r.stderr)[-4000:]
    digests = re.findall(r"^\[(\w+):(\d)\] rank (\d) final weights sha256 (\w+)", out, re.M)
    assert sorted((h, int(k)) for h, k, _, _ in digests) == [("h1", 0), ("h1", 1), ("h2", 2), ("h2", 3)], \
        out[-3000:]
    assert len({d[3] for d in digests}) == 1, digests
    losses = [float(x) for x in re.findall(r"rank 0/4 step \d+ loss ([0-9.]+)", out)]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    rec = mh.show()
    assert all(s["bytes_in"] > 0 for s in rec["ps_servers"]), rec["ps_servers"]


# --- 3. async training on 3 hosts --------------------------------------------------------------------

def test_async_sgd_example_converges_on_3_hosts(mh):
    script = mh.shared / "async_sgd.py"
    shutil.copy(REPO / "examples/ps/async_sgd.py", script)
    script.chmod(0o644)
    example = (REPO / "examples/ps/async_sgd.toml").read_text()
    opt = re.search(r"^\[ps\.optimizer\].*?(?=^\[|\Z)", example, re.M | re.S)[0]
    r = mh.run(spec(mh, "async-sgd", [PY, script, "--steps", "300"], workers='["h1:2", "h2:1"]',
                    servers='["h3"]', sync=False, partition=4194304,
                    env={"OPENBLAS_NUM_THREADS": "1"}, extra=opt), timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    errs = {int(w): float(e) for w, e in re.findall(r"worker (\d): max \|w - w\*\| = (\S+)", out)}
    assert sorted(errs) == [0, 1, 2], out[-3000:]
    assert all(e <= 1e-3 for e in errs.values()), errs
    rec = mh.show()
    # One 64-element key: one server holds it.
    assert [s["host"] for s in rec["ps_servers"]] == ["h3", "h3"], rec["ps_servers"]
    assert sum(s["requests"] for s in rec["ps_servers"]) >= 3 * 300 * 2, rec["ps_servers"]


# --- 4/5. a server host's agent, or a worker, SIGKILLed mid-run ----------------------------------------

def start_loop(mh, cluster, name):
    """A sync job whose 4 workers push_pull for 60 s; returns once all 4 have done a round."""
    script = worker_script(mh)
    m = mh.ml.marker()
    ready = mh.shared / "ready"
    ready.mkdir()
    ready.chmod(0o1777)
    before = host_pids(cluster)
    job = spec(mh, name, [PY, script, "loop", m, 60, ready], env={"MLTRAIN_COMM_TIMEOUT": "20s"})
    p = mh.popen(job)
    err = LineReader(p.stderr)
    try:
        wait_for(lambda: len(list(ready.iterdir())) == 4 or p.poll() is not None, 60, "4 workers in push_pull")
    except BaseException:
        p.kill()
        raise
    if p.poll() is not None:
        out = err.finish(p, 10)
        pytest.fail(f"the job ended (exit {p.returncode}) before its workers ran: {out[-2000:]} {err.text()[-3000:]}")
    return p, err, m, before


def first_failure(err_text):
    """The launcher's summary line, 'mltrain: first failure: ...'."""
    lines = [l for l in err_text.splitlines() if l.startswith("mltrain: first failure:")]
    assert lines, f"no first-failure line: {err_text[-3000:]}"
    return lines[0]


def kill_and_wait(p, err, pid, what):
    """SIGKILLs pid, waits (40 s at most) for the job to end; returns (exit code, seconds it took,
    stdout). The job is killed if it still runs, and its output is collected either way."""
    try:
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        try:
            p.wait(40)
        except subprocess.TimeoutExpired:
            pass
        took = time.monotonic() - t_kill
        rc = p.poll()
        assert rc is not None, f"the job still runs {took:.0f} s after {what} was killed: {err.text()[-3000:]}"
    finally:
        if p.poll() is None:
            p.kill()
        out = err.finish(p, 30)
    return rc, took, out


def test_server_host_agent_killed_fails_the_job_naming_the_host(mh, cluster):
    p, err, m, before = start_loop(mh, cluster, "ps-kill-server")
    try:
        agents = agents_on(cluster, "h3", before["h3"])
        assert len(agents) == 1, f"expected one mltrain-agent on h3: {[(a, _cmdline(a)) for a in agents]}"
    except BaseException:
        p.kill()
        err.finish(p, 30)
        raise
    rc, took, out = kill_and_wait(p, err, agents[0], "h3's agent")
    text = err.text()
    assert rc == 255, f"exit {rc} (want 255, a host lost): {text[-3000:]}"
    # Well below the workers' comm timeout (20 s): the lost connection is seen at once.
    assert took < 10.0, f"the job ended {took:.1f} s after h3's agent was killed: {text[-3000:]}"
    first = first_failure(text)
    assert "h3" in first, f"the first failure does not name h3: {first!r}\n{text[-3000:]}"
    rec = mh.show()
    on_h3 = sorted(s["server"] for s in rec["ps_servers"] if s["host"] == "h3")
    assert len(on_h3) == 2, rec["ps_servers"]
    assert f"(PS servers {on_h3[0]}, {on_h3[1]} ran there)" in first, first
    assert rec["status"] == "host-failure" and rec["exit_code"] == 255, (rec["status"], rec["exit_code"])
    assert rec["failure"]["host"] == "h3", rec["failure"]
    assert "PS-LOOP-DONE" not in out, out[-2000:]
    assert_nothing_left(cluster, before, m)


def test_worker_killed_fails_the_job_naming_it_and_stops_the_servers(mh, cluster):
    p, err, m, before = start_loop(mh, cluster, "ps-kill-worker")
    try:
        on_h2 = sorted(x for x in pids_with_arg(m) if host_of_pid(x) == "h2")
        assert len(on_h2) == 2, [(x, host_of_pid(x)) for x in pids_with_arg(m)]
        server_agents = agents_on(cluster, "h3", before["h3"]) + agents_on(cluster, "h4", before["h4"])
        assert len(server_agents) == 2, server_agents
        victim = on_h2[0]
        # Which rank it is: its RANK variable.
        with open(f"/proc/{victim}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        rank = int(env[b"RANK"])
        assert rank in (2, 3), rank
    except BaseException:
        p.kill()
        err.finish(p, 30)
        raise
    rc, took, out = kill_and_wait(p, err, victim, f"rank {rank}")
    text = err.text()
    assert rc == 128 + signal.SIGKILL, f"exit {rc}: {text[-3000:]}"
    assert took < 10.0, f"the job ended {took:.1f} s after rank {rank} was killed: {text[-3000:]}"
    first = first_failure(text)
    assert f"rank {rank} on h2" in first and "SIGKILL" in first, first
    rec = mh.show()
    assert rec["failure"]["rank"] == rank and rec["failure"]["host"] == "h2", rec["failure"]
    assert "PS-LOOP-DONE" not in out, out[-2000:]
    assert_nothing_left(cluster, before, m)


# --- 6. mltrain bench --mode ps ---------------------------------------------------------------------

def test_bench_mode_ps_on_2_worker_hosts_and_2_server_hosts(mh):
    job = spec(mh, "bench-ps", ["true"], partition=262144)
    b = mh.ml("bench", "--mode", "ps", *mh.args(job), "-b", "64K", "-e", "1M", "-f", "4",
              "--iters", "3", "--warmup", "1", "--check", timeout=180)
    assert b.returncode == 0, (b.stdout + b.stderr)[-3000:]
    assert re.search(r"^# .*--mode ps: 4 workers, 4 PS servers\b.*\bsync\b", b.stdout, re.M), b.stdout
    rows = [l.split() for l in b.stdout.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    # size, servers, ps time, per-worker, total, allreduce, algbw, ps/ar, #wrong
    assert [(int(float(x[0])), int(x[1])) for x in rows] == \
        [(size, s) for size in (65536, 262144, 1048576) for s in (1, 2, 4)], b.stdout
    for x in rows:
        assert len(x) == 9, x
        assert x[-1] == "0", f"wrong results: {x}\n{b.stdout}"
        ps_us, per_worker, total, ar_us = float(x[2]), float(x[3]), float(x[4]), float(x[5])
        assert ps_us > 0 and per_worker > 0 and ar_us > 0, x
        assert total == pytest.approx(4 * per_worker, rel=0.01, abs=0.003), x
