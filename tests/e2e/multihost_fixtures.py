"""Fixtures and helpers for the multi-host end-to-end tests (tests/e2e/test_multihost*.py).

One test cluster (tests/cluster/, network-namespace hosts h1..hN; by default 4 hosts, sshd
MaxSessions 2 on h2) serves the whole session: each module gets it reset to its own settings
(module_cluster) and a test's faults are undone after it; a module that cannot have one (not root,
no netns, no sshd) is skipped with the reason from cluster.available().

Ranks run as the cluster's login user (mltest), which cannot write into root's pytest tmp dirs:
files a rank writes go to `mh.shared` (mode 1777 under /tmp), and ranks run with `--workdir /tmp`
unless a test says otherwise. Hosts share the file system and PID space with the test, so a test
can read what ranks wrote and see every host's processes in /proc; which host a process is on is
told by its network namespace (/proc/PID/ns/net against /run/netns/mlt-hK).
"""
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cluster import Cluster, available
from conftest import communicate, pids_with_arg, wait_for

MAX_SESSIONS = {"h2": 2}


def module_cluster(before_down=None, **up):
    """A module-scoped `cluster` fixture: the session's test cluster set up as Cluster.up(**up)
    says for this module (`before_down()` at its end); skipped where no cluster can be brought up.
    In a test module: `cluster = module_cluster(n=1)`.

    One cluster serves the whole session: its network and keys are made once, and each module
    starts with every host reset (every process killed, sshd started afresh with the module's
    settings: up.sh --reuse); faults a test injects are undone after it (conftest). The last
    module's cluster is taken down when the session ends."""
    @pytest.fixture(scope="module", name="cluster")
    def fixture():
        ok, why = available()
        if not ok:
            pytest.skip(why)
        c = Cluster.up(reuse=True, **up)
        _session_clusters.append(c)
        try:
            yield c
        finally:
            if before_down:
                before_down()
    return fixture


_session_clusters = []


def down_session_cluster():
    """Take the session's cluster down (conftest's pytest_sessionfinish): once, if one was up."""
    if _session_clusters:
        _session_clusters[-1].down()
        _session_clusters.clear()


cluster = module_cluster(n=4, max_sessions=MAX_SESSIONS)


@pytest.fixture(scope="module")
def shared_root():
    d = Path(tempfile.mkdtemp(prefix="mlt-mh-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class MultiHost:
    """Runs `mltrain` (through conftest's `ml`) against the test cluster."""

    def __init__(self, ml, cluster, shared: Path):
        self.ml = ml
        self.c = cluster
        self.shared = shared

    def args(self, *args):
        return ["--ssh-config", str(self.c.ssh_config), *map(str, args)]

    def run(self, *args, timeout=60, **kw):
        """`mltrain run --ssh-config CFG ARGS...` to completion."""
        return self.ml("run", *self.args(*args), timeout=timeout, **kw)

    def popen(self, *args, **kw):
        return self.ml.popen("run", *self.args(*args), text=True, **kw)

    def show(self):
        import json
        p = self.ml("show", "--json", "latest")
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    def latest_run_dir(self):
        """The run folder of the run started last (ids sort by second, then by name)."""
        import json

        def started(d):
            try:
                return json.loads((d / "run.json").read_text()).get("started_at") or ""
            except (OSError, ValueError):
                return ""
        runs = self.ml.run_dirs()
        assert runs, "no run folder"
        return max(runs, key=lambda d: (started(d), d.stat().st_mtime))

    def rank_log(self, rank: int) -> str:
        return (self.latest_run_dir() / f"rank-{rank}.log").read_text(errors="replace")

    def touched(self):
        """Files ranks created in the shared dir."""
        return sorted(p.name for p in self.shared.iterdir())


@pytest.fixture
def mh(ml, cluster, shared_root, request):
    d = shared_root / request.node.name.replace("/", "_").replace("[", "_").replace("]", "_")
    d.mkdir()
    d.chmod(0o1777)
    yield MultiHost(ml, cluster, d)


# -- /proc helpers ---------------------------------------------------------------------------------

def netns_inode(host: str) -> int:
    return os.stat(f"/run/netns/mlt-{host}").st_ino


def host_of_pid(pid: int, hosts=("h1", "h2", "h3", "h4")):
    """'hK' whose network namespace the process is in, 'root' for the test's own, None if gone."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    for h in hosts:
        try:
            if link == f"net:[{netns_inode(h)}]":
                return h
        except OSError:
            pass
    return "root"


def _stat(pid: int):
    with open(f"/proc/{pid}/stat", "rb") as f:
        raw = f.read()
    comm = raw[raw.index(b"(") + 1:raw.rindex(b")")].decode(errors="replace")
    rest = raw[raw.rindex(b")") + 2:].split()
    return comm, rest[0].decode(), int(rest[1])  # comm, state, ppid


def alive(pid: int) -> bool:
    try:
        _, state, _ = _stat(pid)
    except OSError:
        return False
    return state != "Z"


def agent_ancestors(pids):
    """The mltrain-agent processes among the ancestors of `pids` (the job's own agents)."""
    agents = set()
    for pid in pids:
        p = pid
        for _ in range(64):
            try:
                comm, _, ppid = _stat(p)
            except OSError:
                break
            if comm.startswith("mltrain-agent"):
                agents.add(p)
            if ppid <= 1:
                break
            p = ppid
    return sorted(agents)


def uid_of(pid: int):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def wait_pids_gone(pids, within_s: float):
    deadline = time.monotonic() + within_s
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


class LineReader:
    """Reads a pipe in a thread, keeping (monotonic time, line) so a test can ask when a line came."""

    def __init__(self, stream):
        self.lines = []
        self._t = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._t.start()

    def _read(self, stream):
        for line in iter(stream.readline, ""):
            self.lines.append((time.monotonic(), line))

    def first(self, pred):
        for t, line in list(self.lines):
            if pred(line):
                return t, line
        return None

    def text(self):
        return "".join(line for _, line in self.lines)

    def join(self, timeout=10):
        self._t.join(timeout)

    def finish(self, p, timeout):
        """Waits for `p` (killed after `timeout`) and returns its stdout. Not Popen.communicate:
        that reads stderr too, and the lines it takes never reach this reader (a summary line that
        went missing so failed test_multihost_ps under load)."""
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
        out = p.stdout.read() if p.stdout else ""
        self.join()
        return out


def fingerprint(pubkey_file) -> str:
    """'SHA256:...' of a public key file (ssh-keygen -lf)."""
    out = subprocess.run(["ssh-keygen", "-lf", str(pubkey_file)], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return out.split()[1]


@functools.lru_cache(maxsize=None)  # asked by five modules at collection; importing torch takes seconds
def python_has_torch(python="/usr/bin/python3"):
    try:
        p = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{python}: {e}"
    if p.returncode != 0:
        return False, f"{python} cannot import torch: {p.stderr.strip().splitlines()[-1:]}"
    return True, ""


def cached_agent_path(mh, host="h1"):
    """Path of this binary's agent in the cluster user's cache, read from a running agent's exe
    (runs a one-rank job on `host` to find it)."""
    m = mh.ml.marker()
    p = mh.popen("-H", f"{host}:1", "--workdir", "/tmp", "--", "sleep", m)
    # The rank, then the agent above it (read again until the chain reads whole: a loaded machine
    # can show the rank before its parent's /proc entry answers).
    agents = wait_for(lambda: agent_ancestors([x for x in pids_with_arg(m) if x != p.pid]), 20,
                      "a rank with the mltrain-agent above it")
    path = os.readlink(f"/proc/{agents[0]}/exe")
    p.send_signal(signal.SIGTERM)
    communicate(p, 30)
    assert "/mltrain-agent-" in path and os.path.isfile(path), path
    return path
