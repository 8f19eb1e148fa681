"""Issue 16, items 1 and 3: strangers cannot stall or kill a job through its rendezvous store.

Another local user (nobody), who cannot know the job's MLTRAIN_TOKEN, holds 20,000 idle
connections to the store that rank 0 hosts while ranks 1-3 are still to join: the job must
still start and finish with correct results (`__bench-worker --check`)."""
import os
import resource
import socket
import subprocess
import sys
import time

import pytest

from conftest import communicate, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="floods as another user: needs root")

FLOOD = r"""
import os, socket, sys, time
host, port, n, done = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
socks = []
for i in range(n):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((host, port))
    except BlockingIOError:
        pass
    except OSError:
        s.close()
        continue
    socks.append(s)
print("opened", len(socks), flush=True)
while not os.path.exists(done):
    time.sleep(0.05)
"""


def _as_nobody(nofile):
    def become():
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    return become


def _store_addr(ml):
    def addr():
        dirs = ml.run_dirs()
        if not dirs or not (dirs[-1] / "run.json").exists():
            return None
        import json
        doc = json.loads((dirs[-1] / "run.json").read_text())
        return doc["ranks"][0]["env"].get("MLTRAIN_STORE_ADDR") if doc["ranks"] else None
    wait_for(lambda: addr() is not None, 20, "the run record")
    host, port = addr().rsplit(":", 1)
    return host, int(port)


def _listening(host, port):
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_idle_connection_flood_does_not_stall_or_kill_the_job(ml, tmp_path):
    go = f"/tmp/mltrain-flood-go-{os.getpid()}"
    done = f"/tmp/mltrain-flood-done-{os.getpid()}"
    # Ranks at the common default of 1,024 descriptors: without bounds the store runs out.
    worker = (f'ulimit -n 1024; [ "$RANK" = 0 ] || until [ -e {go} ]; do sleep 0.05; done; '
              f'exec {ml.bin} __bench-worker -b 64K -e 64K --iters 200 --warmup 0 --check')
    job = ml.popen("run", "-n", "4", "--env", "MLTRAIN_COMM_TIMEOUT=60s", "--", "sh", "-c", worker)
    floods = []
    try:
        host, port = _store_addr(ml)
        wait_for(lambda: _listening(host, port), 20, "rank 0's store")
        # Two processes of 10,000 each (a process may hold at most 20,000 descriptors here).
        floods = [subprocess.Popen([sys.executable, "-c", FLOOD, host, str(port), "10000", done],
                                   stdout=subprocess.PIPE, text=True, preexec_fn=_as_nobody(10100))
                  for _ in range(2)]
        opened = 0
        for f in floods:
            line = f.stdout.readline()
            assert line.startswith("opened "), line
            opened += int(line.split()[1])
        assert opened >= 19000, opened
        open(go, "w").close()
        out, err = communicate(job, 120)
        assert job.returncode == 0, err[-3000:]
        table = [ln for ln in out.splitlines() if ln.startswith("[0]") and "65536" in ln]
        assert table and table[-1].split()[-1] == "0", out[-2000:]  # #wrong
        assert "terminate called" not in err and "Too many open files" not in err.replace(
            "accept(): Too many open files; dropping unproven connections", "")
    finally:
        open(done, "w").close()
        for f in floods:
            f.wait(timeout=30)
        for f in (go, done):
            if os.path.exists(f):
                os.unlink(f)
