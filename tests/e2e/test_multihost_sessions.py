"""The agent upload on a host whose sshd allows one session per connection (MaxSessions 1).

A cluster of its own (h1 default, h2 MaxSessions 1), so this module brings one up and down.
"""
import os

import pytest

from multihost_fixtures import cached_agent_path, mh, module_cluster, shared_root  # noqa: F401


cluster = module_cluster(n=2, max_sessions={"h2": 1})


def test_cached_agent_runs_with_max_sessions_1(mh, cluster):
    assert "MaxSessions 1" in (cluster.dir / "h2" / "sshd_config").read_text()
    cached_agent_path(mh)   # makes sure it is cached
    p = mh.run("-H", "h2:4", "--workdir", "/tmp", "--", "sh", "-c", 'echo "r$RANK $(hostname)"')
    assert p.returncode == 0, p.stderr
    assert sorted(l.split("] ")[1] for l in p.stdout.splitlines() if "] r" in l) == \
        [f"r{i} h2" for i in range(4)], p.stdout


def test_agent_upload_with_max_sessions_1(mh, cluster):
    path = cached_agent_path(mh)
    os.unlink(path)           # the next connect must upload it again
    p = mh.run("-H", "h2:2", "--workdir", "/tmp", "--", "true")
    assert p.returncode == 0, p.stderr
    assert os.path.isfile(path)
