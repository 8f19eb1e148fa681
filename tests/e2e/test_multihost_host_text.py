"""Text a host sends reaches the terminal escaped and bounded, on every path: here what lands on the
agent's SSH stderr (a rank can write to its agent's fd 2 through /proc, as ~/.ssh/rc can). A
one-host cluster of its own."""
import pytest

from conftest import communicate
from multihost_fixtures import mh, module_cluster, shared_root  # noqa: F401

cluster = module_cluster(n=1)

# A rank that finds its agent (up its parents) and writes terminal controls, then 4 MiB, to its fd 2.
TO_AGENT_STDERR = r'''
import os
pid = os.getppid()
while pid > 1:
    stat = open(f"/proc/{pid}/stat").read()
    if stat[stat.index("(") + 1:stat.rindex(")")].startswith("mltrain-agent"):
        break
    pid = int(stat[stat.rindex(")") + 2:].split()[1])
fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY)
os.write(fd, b"\x1b]0;owned\x07\x1b[2Jcleared\n")
for _ in range(64):
    os.write(fd, b"x" * 65535 + b"\n")
os.close(fd)
print("wrote", flush=True)
'''


def test_what_lands_on_the_agents_ssh_stderr_is_escaped_and_bounded(mh):
    p = mh.popen("-H", "h1:1", "--workdir", "/tmp", "--", "/usr/bin/python3", "-c", TO_AGENT_STDERR)
    out, err = communicate(p, 120)
    assert p.returncode == 0, err[-2000:]
    assert "wrote" in out
    assert "\x1b" not in err and "\x07" not in err
    assert "mltrain: h1: \\x1b]0;owned\\x07\\x1b[2Jcleared" in err, err[:2000]
    assert len(err) < 256 * 1024, len(err)
    assert "more bytes of the agent's stderr were not shown" in err, err[-2000:]
