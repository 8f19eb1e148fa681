"""Hosts that share a name (cloned machines) but not memory, and --stdin over SSH.

The cluster's h1 and h2 are both named `twin` (tests/cluster/up.sh --hostname); every cluster host
has its own /dev/shm. The comm library must choose shared memory by what can share memory (boot id
and /dev/shm), not by name: ranks on one host use shm, ranks on the twins TCP.
"""
import re

import pytest

from multihost_fixtures import MultiHost, module_cluster, shared_root  # noqa: F401 (fixture)


cluster = module_cluster(n=2, hostnames={"h1": "twin", "h2": "twin"})


@pytest.fixture
def mh(ml, cluster, shared_root, request):  # noqa: F811
    d = shared_root / request.node.name
    d.mkdir()
    d.chmod(0o1777)
    yield MultiHost(ml, cluster, d)


def test_twins_by_name_talk_tcp_and_ranks_on_one_host_shm(mh, cluster):
    assert cluster.run("h1", ["hostname"]).stdout.strip() == "twin"
    assert cluster.run("h2", ["hostname"]).stdout.strip() == "twin"
    r = mh.run("-H", "h1:2,h2:2", "-n", "4", "--workdir", "/tmp", "--env", "MLTRAIN_COMM_DEBUG=1",
               "--env", "MLTRAIN_COMM_TIMEOUT=30s",
               "--", "sh", "-c", 'exec "$MLTRAIN_RUNTIME/bin/mltrain-comm-bench" "$@"', "bench",
               "-b", "4K", "-e", "64K", "--iters", "5", "--warmup", "1", timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    links = {}
    for m in re.finditer(r"rank (\d) \(twin\): link to rank (\d) \(twin\): (shm|tcp)", out):
        links[(int(m[1]), int(m[2]))] = m[3]
    # Ranks 0, 1 on h1 and 2, 3 on h2 (ring neighbours: 0-1, 1-2, 2-3, 3-0).
    assert links.get((0, 1)) == "shm" and links.get((1, 0)) == "shm", out[-3000:]
    assert links.get((2, 3)) == "shm" and links.get((3, 2)) == "shm", out[-3000:]
    assert links.get((1, 2)) == "tcp" and links.get((2, 1)) == "tcp", out[-3000:]
    assert links.get((3, 0)) == "tcp" and links.get((0, 3)) == "tcp", out[-3000:]


def test_stdin_reaches_a_remote_rank(mh):
    r = mh.run("-H", "h1:1,h2:1", "-n", "2", "--stdin-rank", "1", "--workdir", "/tmp", "--",
               "sh", "-c", "read x; echo got $x", input="hi\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "[h2:1] got hi" in lines, r.stdout
    assert "[h1:0] got" in [ln.rstrip() for ln in lines], r.stdout


def test_stdin_to_rank_0_remote(mh):
    r = mh.run("-H", "h2:2", "-n", "2", "--stdin", "--workdir", "/tmp", "--",
               "sh", "-c", "read x; echo got $x", input="hi\n")
    assert r.returncode == 0, r.stderr
    assert "got hi" in r.stdout, r.stdout
