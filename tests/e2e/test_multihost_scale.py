"""Launch at scale: 32 test-cluster hosts x 8 ranks (256 ranks, one SSH connection and one agent
per host). The launcher's peak memory, descriptors and threads stay bounded while every rank runs,
and the whole gang starts and ends. The speed curve against mpirun is bench/launch (SCALE=...)."""
import os
import re
import time

import pytest

from conftest import communicate
from multihost_fixtures import mh, module_cluster, shared_root  # noqa: F401 (fixtures)

HOSTS, PER_HOST = 32, 8
cluster = module_cluster(n=HOSTS)
# 256 ranks and their peak memory: measured with the machine to itself (scripts/test.sh runs it alone).
pytestmark = pytest.mark.alone


def status_of(pid):
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                fields[k] = v.split()
        fields["fds"] = [str(len(os.listdir(f"/proc/{pid}/fd")))]
    except OSError:
        return None
    return fields


def test_32_hosts_x_8_ranks_start_together_and_the_launcher_stays_small(mh, tmp_path):  # noqa: F811
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"h{k} slots={PER_HOST}\n" for k in range(1, HOSTS + 1)))
    p = mh.popen("--hostfile", hostfile, "--workdir", "/tmp", "--", "sh", "-c", "sleep 3; echo done $RANK")
    peak_kb = fds = threads = 0
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline:
        s = status_of(p.pid)
        if s:
            peak_kb = max(peak_kb, int(s.get("VmHWM", ["0"])[0]))
            fds = max(fds, int(s["fds"][0]))
            threads = max(threads, int(s.get("Threads", ["0"])[0]))
        time.sleep(0.05)
    out, err = communicate(p, 30)
    assert p.returncode == 0, err
    assert sorted(int(r) for r in re.findall(r"done (\d+)", out)) == list(range(HOSTS * PER_HOST)), out[-2000:]
    assert f"{HOSTS * PER_HOST} ranks succeeded" in err, err
    # Bounded: well under 100 MB; a descriptor per rank log and a few per host, under the usual
    # 1024 limit; a pump thread per host and a handful more.
    assert 0 < peak_kb < 100 * 1024, peak_kb
    assert fds < 1024, fds
    assert threads <= HOSTS + 16, threads
    print(f"peak RSS {peak_kb / 1024:.1f} MB, {fds} descriptors, {threads} threads")
