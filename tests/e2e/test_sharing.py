"""Jobs sharing one host's GPUs (docs/sharing.md), on this machine with the fake NVML (4 GPUs):
each job leases the GPUs it runs on, so two jobs never get the same one; a job that finds too few
free fails at once naming the holder, or with --queue waits its turn; a GPU a foreign process
computes on is never picked; whatever ends a job (Ctrl-C while it waits, SIGKILL of its launcher)
frees what it held. Every test has a lease space of its own (conftest), so tests running at once
never contend."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

import gpu_fakes
from conftest import communicate, wait_for

CLEAN = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


@pytest.fixture
def fakes(tmp_path):
    return gpu_fakes.install(tmp_path / "fakes", "* gpus 4\n")


def job(ml, fakes, name, gpus_per_rank=1, ranks=2, hold=True, extra=""):
    """A job of `ranks` ranks with `gpus_per_rank` GPUs each, which prints each rank's GPUs and,
    with `hold`, waits until its go-file exists."""
    go = ml.dir / f"go-{name}"
    up = ml.dir / f"up-{name}"
    wait = f'touch {up}.$RANK; while [ ! -e {go} ]; do sleep 0.05; done; ' if hold else ""
    spec = ml.write(f"{name}.toml", f"""
name = "{name}"
[run]
command = 'echo "GPUS $RANK $CUDA_VISIBLE_DEVICES"; {wait}true'
[run.env]
MLTRAIN_NVML_LIBRARY = "{fakes / 'libnvidia-ml.so.1'}"
[cluster]
nprocs = {ranks}
{extra}
[gpus]
per_proc = {gpus_per_rank}
""")
    return spec, go, up


def gpus_of(out):
    """{rank: [GPU indices]} from the GPUS lines."""
    got = {}
    for m in re.finditer(r"GPUS (\d+) (\S+)", out):
        got[int(m[1])] = [int(g) for g in m[2].split(",")]
    return got


def start(ml, spec, *args):
    return ml.popen("run", spec, *args, text=True, unset=CLEAN)


def started(ml, up, ranks=2, timeout=60):
    wait_for(lambda: len(list(ml.dir.glob(up.name + ".*"))) == ranks, timeout, f"{up.name}: ranks up")


def queue_leases(ml, kind):
    """The names of this test's leases of `kind` ("queue", "gpu", "job") on this machine (each once:
    a lease another launcher is connected to, asking whether it is held, is listed with it)."""
    prefix = f"@mltrain-lease-{ml.lease_space}/{kind}/"
    with open("/proc/net/unix") as f:
        return sorted({line.split()[-1] for line in f if line.rstrip().split()[-1].startswith(prefix)})


def test_two_jobs_get_disjoint_gpus_and_a_third_is_refused_naming_the_holder(ml, fakes):
    a, go_a, up_a = job(ml, fakes, "job-a")
    b, go_b, up_b = job(ml, fakes, "job-b")
    c, _, _ = job(ml, fakes, "job-c", hold=False)
    pa = start(ml, a)
    started(ml, up_a)
    pb = start(ml, b)
    started(ml, up_b)
    try:
        r = ml("run", c, timeout=60, unset=CLEAN)
        assert r.returncode == 75, r.stderr
        assert "what the job needs is held by other jobs; no rank was started" in r.stderr, r.stderr
        assert re.search(r"localhost: GPUs 0,1 held by run \S+-job-a-\S+ \(\w+@\S+\) for \d", r.stderr), r.stderr
        assert re.search(r"GPUs 2,3 held by run \S+-job-b-", r.stderr), r.stderr
        assert "--queue" in r.stderr, r.stderr
        assert "GPUS" not in r.stdout  # nothing started
        rec = json.loads(ml("show", "--json", "latest").stdout)
        assert rec["status"] == "busy" and rec["exit_code"] == 75, rec
    finally:
        go_a.touch()
        go_b.touch()
    out_a, err_a = communicate(pa, 60)
    out_b, err_b = communicate(pb, 60)
    assert pa.returncode == 0 and pb.returncode == 0, err_a + err_b
    ga, gb = gpus_of(out_a), gpus_of(out_b)
    assert sorted(sum(ga.values(), []) + sum(gb.values(), [])) == [0, 1, 2, 3], (ga, gb)
    # Both ended: their GPUs are free again.
    r = ml("run", c, timeout=60, unset=CLEAN)
    assert r.returncode == 0, r.stderr
    assert sorted(sum(gpus_of(r.stdout).values(), [])) == [0, 1]
    # The record names each rank's physical GPUs by index and UUID, as its CUDA_VISIBLE_DEVICES has them.
    rec = json.loads(ml("show", "--json", "latest").stdout)
    for k in rec["ranks"]:
        (g,) = k["gpus"]
        assert g["index"] == int(k["env"]["CUDA_VISIBLE_DEVICES"]), k
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-0000-4000-8000-0{11}" + str(g["index"]), g["uuid"]), g
    shown = ml("show", "latest").stdout
    assert re.search(r"\bGPUS\n0 .* exit 0\s+0 \(GPU-[0-9a-f]{8}-0000-4000-8000-000000000000\)", shown, re.S), shown


def test_a_queued_job_waits_then_starts_when_gpus_free(ml, fakes):
    a, go_a, up_a = job(ml, fakes, "hold", ranks=4)
    c, go_c, up_c = job(ml, fakes, "waits")
    pa = start(ml, a)
    started(ml, up_a, ranks=4)
    pc = start(ml, c, "--queue")
    try:
        # Not started while the GPUs are held; it takes its place in the queue and waits.
        wait_for(lambda: len(queue_leases(ml, "queue")) == 1, 30, "the queued job's place")
        time.sleep(2)
        assert pc.poll() is None
        assert not list(ml.dir.glob(up_c.name + ".*"))
        assert len(queue_leases(ml, "queue")) == 1
        go_a.touch()
        communicate(pa, 60)
        assert pa.returncode == 0
        started(ml, up_c)
        assert queue_leases(ml, "queue") == []  # running, it holds GPUs, not a place
    finally:
        go_a.touch()
        go_c.touch()
    out, err = communicate(pc, 60)
    assert pc.returncode == 0, err
    assert "mltrain: waiting for 2 GPUs on localhost" in err, err
    assert sorted(sum(gpus_of(out).values(), [])) == [0, 1]


def test_the_timeout_counts_from_the_ranks_start_not_from_the_wait_in_the_queue(ml, fakes):
    a, go_a, up_a = job(ml, fakes, "hold", ranks=4)
    c, go_c, up_c = job(ml, fakes, "waits", hold=False)
    pa = start(ml, a)
    started(ml, up_a, ranks=4)
    pc = start(ml, c, "--queue", "--timeout", "3s")
    try:
        wait_for(lambda: len(queue_leases(ml, "queue")) == 1, 30, "the queued job's place")
        time.sleep(4)  # the wait outlasts the timeout (the job was started and killed at once: exit 124)
        go_a.touch()
        communicate(pa, 60)
    finally:
        go_a.touch()
    out, err = communicate(pc, 60)
    assert pc.returncode == 0, err
    # Two GPUs of the four, one each: which two depends on the order the first job's leases went.
    got = sum(gpus_of(out).values(), [])
    assert len(got) == 2 and len(set(got)) == 2 and set(got) <= {0, 1, 2, 3}, out


def test_a_job_leaves_the_queue_after_its_queue_timeout_claiming_nothing(ml, fakes):
    a, go_a, up_a = job(ml, fakes, "hold", ranks=4)
    c, _, _ = job(ml, fakes, "gives-up", hold=False)
    pa = start(ml, a)
    started(ml, up_a, ranks=4)
    try:
        r = ml("run", c, "--queue", "--queue-timeout", "1s", timeout=60, unset=CLEAN)
        assert r.returncode == 75, r.stderr
        assert "the job waited in the queue for 1.0s ([cluster] queue_timeout) and left it; no rank was started" \
            in r.stderr, r.stderr
        assert re.search(r"localhost: GPUs 0-3 held by run \S+-hold-", r.stderr), r.stderr
        assert "--queue-timeout" in r.stderr and "GPUS" not in r.stdout
        assert queue_leases(ml, "queue") == []
        rec = json.loads(ml("show", "--json", "latest").stdout)
        assert rec["status"] == "busy" and rec["exit_code"] == 75, rec
    finally:
        go_a.touch()
    communicate(pa, 60)
    assert pa.returncode == 0


def test_ctrl_c_while_waiting_leaves_no_place_in_the_queue(ml, fakes):
    a, go_a, up_a = job(ml, fakes, "holder", ranks=4)
    c, _, up_c = job(ml, fakes, "waiter")
    pa = start(ml, a)
    started(ml, up_a, ranks=4)
    try:
        pc = start(ml, c, "--queue")
        wait_for(lambda: len(queue_leases(ml, "queue")) == 1, 60, "the waiting job's place")
        pc.send_signal(signal.SIGINT)
        out, err = communicate(pc, 60)
        assert pc.returncode == 130, err
        assert "the job left the queue, no rank was started" in err, err
        assert not list(ml.dir.glob(up_c.name + ".*"))
        wait_for(lambda: queue_leases(ml, "queue") == [], 10, "the place to be gone")
    finally:
        go_a.touch()
    communicate(pa, 60)
    assert pa.returncode == 0


def test_a_gpu_a_foreign_process_computes_on_is_not_picked(ml, fakes):
    (fakes / "fake-gpus.conf").write_text("* gpus 4\n* pids.0 4242:1000\n* pids.2 4343:-\n")
    c, _, _ = job(ml, fakes, "picky", hold=False)
    r = ml("run", c, timeout=60, unset=CLEAN)
    assert r.returncode == 0, r.stderr
    assert sorted(sum(gpus_of(r.stdout).values(), [])) == [1, 3]
    big, _, _ = job(ml, fakes, "big", ranks=3, hold=False)
    r = ml("run", big, timeout=60, unset=CLEAN)
    assert r.returncode == 75, r.stderr
    assert "GPU 0 runs a process that is not mltrain's" in r.stderr, r.stderr


def test_sigkill_of_the_launcher_frees_its_gpus(ml, fakes):
    a, go_a, up_a = job(ml, fakes, "killed", ranks=4)
    pa = start(ml, a)
    started(ml, up_a, ranks=4)
    assert len(queue_leases(ml, "gpu")) == 4
    t0 = time.monotonic()
    pa.send_signal(signal.SIGKILL)
    communicate(pa, 30)
    wait_for(lambda: queue_leases(ml, "gpu") == [], 10, "the killed job's GPU leases to go")
    assert time.monotonic() - t0 < 10
    c, _, _ = job(ml, fakes, "after", ranks=4, hold=False)
    r = ml("run", c, timeout=60, unset=CLEAN)
    assert r.returncode == 0, r.stderr
    go_a.touch()


def test_an_exclusive_job_has_the_host_alone(ml, fakes):
    a, go_a, up_a = job(ml, fakes, "alone", ranks=1, extra="exclusive = true")
    pa = start(ml, a)
    started(ml, up_a, ranks=1)
    try:
        cpu = ml.write("cpu.toml", '[run]\ncommand = "true"\n')
        r = ml("run", cpu, timeout=60, unset=CLEAN)
        assert r.returncode == 75, r.stderr
        assert re.search(r"localhost: held alone by run \S+-alone-", r.stderr), r.stderr
    finally:
        go_a.touch()
    communicate(pa, 60)
    assert pa.returncode == 0


def test_queue_lists_who_holds_each_gpu_and_who_waits(ml, fakes):
    a, go_a, up_a = job(ml, fakes, "holds")
    w, go_w, _ = job(ml, fakes, "wants3", ranks=3)
    pa = start(ml, a)
    started(ml, up_a)
    pw = start(ml, w, "--queue")
    env = {"MLTRAIN_NVML_LIBRARY": str(fakes / "libnvidia-ml.so.1")}
    try:
        wait_for(lambda: len(queue_leases(ml, "queue")) == 1, 60, "the waiting job's place")
        r = ml("queue", timeout=60, env=env, unset=CLEAN)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert re.match(r"HOST\s+GPU\s+RUN\s+USER\s+SINCE\s+UTIL", lines[0]), r.stdout
        assert any(re.match(r"localhost\s+0,1\s+\S+-holds-\S+\s+\w+@\S+\s+\S+\s+0%,0%", l) for l in lines), r.stdout
        assert any(re.match(r"localhost\s+2,3\s+\(free\)", l) for l in lines), r.stdout
        assert any(re.match(r"1\s+\S+-wants3-\S+\s+\w+@\S+\s+3 GPUs on localhost", l) for l in lines), r.stdout
        j = json.loads(ml("queue", "--json", timeout=60, env=env, unset=CLEAN).stdout)
        (host,) = j["hosts"]
        assert host["ok"] and [g["index"] for g in host["gpus"]] == [0, 1, 2, 3]
        held = [g["held_by"]["run"] if g["held_by"] else None for g in host["gpus"]]
        assert held[0] == held[1] and "-holds-" in held[0] and held[2:] == [None, None], held
        assert host["gpus"][0]["held_by"]["answered"] is True
        assert [q["run"] for q in host["queue"]] == [pw_run(ml, "wants3")]
        assert host["queue"][0]["gpus"] == 3
    finally:
        go_a.touch()
        go_w.touch()
    communicate(pa, 60)
    communicate(pw, 60)
    assert pa.returncode == 0 and pw.returncode == 0


def pw_run(ml, name):
    """The run id of the job named `name` (its record)."""
    for d in ml.run_dirs():
        if f"-{name}-" in d.name:
            return d.name
    raise AssertionError(f"no run of {name}")


# One rank of the jobs below: the comm library's store and links, and a PS server, all used; then
# it says where its job met and which shared memory it mapped, and waits until told.
PORTS_WORKER = r'''
import os, sys, time
import numpy as np
import mltrain, mltrain.ps as ps
c = mltrain.init()
x = np.full(4096, c.rank + 1.0, np.float32)
c.allreduce(x)
assert x[0] == 3.0, x[0]
p = ps.init()
y = np.ones(8, np.float32)
p.declare("k", y)
p.push_pull("k", y)
shm = sorted(n for n in os.listdir("/dev/shm") if n.startswith("mltrain-" + os.environ["MLTRAIN_RUN_ID"]))
print("PORTS", os.environ["MLTRAIN_RUN_ID"], os.environ["MASTER_PORT"], os.environ["MLTRAIN_STORE_ADDR"],
      os.environ["DMLC_PS_ROOT_PORT"], os.environ["MLTRAIN_PS_SERVERS"], ",".join(shm) or "-", flush=True)
open(sys.argv[1] + "." + os.environ["RANK"], "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
c.barrier()
'''


def test_four_jobs_at_once_get_their_own_ports_and_shared_memory(ml):
    """Four jobs started together on one host: each its own master, store and PS ports and its own
    /dev/shm names (named after its run), and all four succeed."""
    worker = ml.write("ports_worker.py", PORTS_WORKER)
    go = ml.dir / "go-ports"
    procs, ups = [], []
    for k in range(4):
        up = ml.dir / f"up-ports{k}"
        spec = ml.write(f"ports{k}.toml", f'''
name = "ports{k}"
[run]
argv = ["/usr/bin/python3", "{worker}", "{up}", "{go}"]
[cluster]
nprocs = 2
[ps]
servers_per_host = 1
''')
        ups.append(up)
        procs.append(ml.popen("run", spec, text=True))
    try:
        wait_for(lambda: all(len(list(ml.dir.glob(u.name + ".*"))) == 2 for u in ups), 180, "every job's ranks")
    finally:
        go.touch()
    per_job = {}
    for p in procs:
        out, err = communicate(p, 120)
        assert p.returncode == 0, err
        for m in re.finditer(r"PORTS (\S+) (\S+) (\S+) (\S+) (\S+) (\S+)", out):
            run, master, store, ps_root, servers, shm = m.groups()
            per_job.setdefault(run, set()).add((master, store, ps_root, servers))
            for name in shm.split(","):  # every shared-memory name a rank mapped is its own run's
                assert name == "-" or name.startswith("mltrain-" + run), (run, shm)
    assert len(per_job) == 4, per_job
    assert all(len(v) == 1 for v in per_job.values()), per_job  # one rendezvous a job
    firsts = [next(iter(v)) for v in per_job.values()]
    for i in range(4):  # master, store, PS root port and the PS servers: no two jobs share one
        assert len({f[i] for f in firsts}) == 4, firsts


# A stranger on the host (nobody) binds lease names with made-up answers: the host alone, a queue
# place dated 1970, a GPU, a job. Any local user can bind any abstract socket name, so a holder is
# believed only when the kernel vouches for it (a live mltrain agent that did not claim to hold it
# from before it started); a squatter is named once and otherwise ignored.
def as_nobody():
    """preexec_fn: the child runs as another local user (nobody)."""
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


SQUATTER = r'''
import os, select, socket, sys, time
if os.environ.get("SQUAT_AS"):  # a determined one: named like an agent, its answer plausible
    with open("/proc/self/comm", "w") as f:
        f.write(os.environ["SQUAT_AS"])
socks = []
for name in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0" + name)
    s.listen(64)
    socks.append(s)
print("bound", flush=True)
while True:
    for s in select.select(socks, [], [])[0]:
        c, _ = s.accept()
        since = int(time.time()) if os.environ.get("SQUAT_AS") else 1
        c.sendall(b"run=20261201-000000-bert\nuser=alice\nlauncher=laptop\nsince=%d\n" % since)
        c.close()
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="plays another local user (nobody): needs root")
def test_a_stranger_squatting_every_lease_name_blocks_no_job(ml, fakes):
    prefix = f"mltrain-lease-{ml.lease_space}/"
    names = [prefix + n for n in ("exclusive", "queue/0000000000000000000-zzz", "job/fake",
                                  "gpu/" + gpu_fakes.uuid(socket.gethostname(), 0))]
    squat = subprocess.Popen([sys.executable, "-c", SQUATTER, *names], stdout=subprocess.PIPE, text=True,
                             preexec_fn=as_nobody)
    try:
        assert squat.stdout.readline().strip() == "bound"
        # A job without GPUs (the exclusive squatter failed every job with exit 75).
        cpu = ml.write("cpu.toml", '[run]\ncommand = "echo ran"\n')
        r = ml("run", cpu, timeout=60, unset=CLEAN)
        assert r.returncode == 0, r.stderr
        assert re.search(r"localhost: ignoring the lease exclusive, held by uid 65534 \(nobody\), pid \d+: "
                         r"it is not an mltrain agent", r.stderr), r.stderr
        # A queued job of every GPU: no job ahead of it (the 1970 place made it wait forever), GPU 0 too.
        spec, _, _ = job(ml, fakes, "all4", ranks=4, hold=False)
        r = ml("run", spec, "--queue", timeout=60, unset=CLEAN)
        assert r.returncode == 0, r.stderr
        assert sorted(sum(gpus_of(r.stdout).values(), [])) == [0, 1, 2, 3], r.stdout
        for name in ("exclusive", "queue/0000000000000000000-zzz", "gpu/"):
            assert len(re.findall(r"ignoring the lease " + re.escape(name), r.stderr)) == 1, r.stderr
        # The host alone, while the stranger holds the name.
        a, go_a, up_a = job(ml, fakes, "alone", ranks=1, extra="exclusive = true")
        pa = start(ml, a)
        started(ml, up_a, ranks=1)
        try:
            # ... which excludes a genuine job all the same, and `mltrain queue` shows both holders
            # with the account behind the stranger's made-up name.
            r = ml("run", cpu, timeout=60, unset=CLEAN)
            assert r.returncode == 75 and re.search(r"held alone by run \S+-alone-", r.stderr), r.stderr
            env = {"MLTRAIN_NVML_LIBRARY": str(fakes / "libnvidia-ml.so.1")}
            q = ml("queue", timeout=60, env=env, unset=CLEAN)
            assert q.returncode == 0, q.stderr
            assert re.search(r"\S+-alone-\S+\s+\S+\s+\S+\s+\(the host alone\)", q.stdout), q.stdout
            assert re.search(r"\(ignored: it is not an mltrain agent.*alice@laptop as nobody", q.stdout), q.stdout
        finally:
            go_a.touch()
        communicate(pa, 60)
        assert pa.returncode == 0
    finally:
        squat.kill()
        squat.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="plays another local user (nobody): needs root")
def test_a_squatter_named_like_an_agent_with_a_plausible_answer_blocks_no_job(ml, fakes):
    """Issue 47 item 2: a process named mltrain-agent-x whose answer is dated now passed every check."""
    names = [f"mltrain-lease-{ml.lease_space}/exclusive"]
    squat = subprocess.Popen([sys.executable, "-c", SQUATTER, *names], stdout=subprocess.PIPE, text=True,
                             preexec_fn=as_nobody, env=dict(os.environ, SQUAT_AS="mltrain-agent-x"))
    try:
        assert squat.stdout.readline().strip() == "bound"
        cpu = ml.write("cpu.toml", '[run]\ncommand = "echo ran"\n')
        r = ml("run", cpu, timeout=60, unset=CLEAN)
        assert r.returncode == 0 and "ran" in r.stdout, r.stderr
        assert len(re.findall(r"localhost: ignoring the lease exclusive, held by uid 65534 \(nobody\), pid \d+: "
                              r"it is not an mltrain agent \(its process is 'mltrain-agent-x', run as '[^']*python",
                              r.stderr)) == 1, r.stderr
    finally:
        squat.kill()
        squat.wait()


def test_queue_reads_utilization_from_nvidia_smi_when_nvml_does_not_load(ml, fakes, tmp_path):
    (fakes / "fake-gpus.conf").write_text("* gpus 2\n* util 87\n")
    env = {"MLTRAIN_NVML_LIBRARY": str(tmp_path / "none" / "libnvidia-ml.so.1"), "PATH": f"{fakes}:/usr/bin:/bin"}
    r = ml("queue", timeout=60, env=env, unset=CLEAN)
    assert r.returncode == 0, r.stderr
    # As `top` reads it from the same nvidia-smi (the column said '-,-').
    assert re.search(r"localhost\s+0,1\s+\(free\)\s+87%,87%", r.stdout), r.stdout


def test_a_detached_queued_job_returns_at_once_and_is_recorded_queued_then_running(ml, fakes):
    a, go_a, up_a = job(ml, fakes, "hold", ranks=4)
    c, _, _ = job(ml, fakes, "later", hold=False)
    pa = start(ml, a)
    started(ml, up_a, ranks=4)
    try:
        # It waited silently until the job left the queue (7.6 s with no line).
        r = ml("run", "-d", c, "--queue", timeout=30, unset=CLEAN)
        assert r.returncode == 0, r.stderr
        run_id = r.stdout.strip()
        assert f"mltrain: run {run_id} waits in the hosts' queue (waiting for 2 GPUs on localhost)" in r.stderr, r.stderr
        rec = json.loads(ml("show", "--json", run_id).stdout)
        assert rec["status"] == "queued" and rec["exit_code"] is None, rec
        assert re.search(rf"{re.escape(run_id)}\s.*\bqueued\b", ml("ls").stdout), ml("ls").stdout
    finally:
        go_a.touch()
    communicate(pa, 60)
    wait_for(lambda: json.loads(ml("show", "--json", run_id).stdout)["status"] == "succeeded", 60,
             "the queued job to run and end")
    rec = json.loads(ml("show", "--json", run_id).stdout)
    assert rec["queued_s"] > 0 and sorted(sum(gpus_of(ml("logs", run_id).stdout).values(), [])) == [0, 1], rec
    assert "waited " in ml("show", run_id).stdout
