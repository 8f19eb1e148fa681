"""The multi-host test cluster (tests/cluster/*.sh) from Python: stdlib only, for pytest fixtures.

Each "host" hK is a network namespace mlt-hK on bridge mltbr0 with its own sshd on
10.231.0.(10+K):22. The hosts share the file system and PID space with the test process, so the
repo, the built binary and tmp_path exist on every host. Needs root; see tests/cluster/README.md.

    from cluster import Cluster, available

    @pytest.fixture(scope="module")
    def cluster():
        ok, why = available()
        if not ok:
            pytest.skip(why)
        c = Cluster.up(n=4, max_sessions={"h2": 2})
        yield c
        c.down()

    def test_cut(cluster):
        cluster.cut("h3")      # silent: packets to/from h3 vanish, TCP peers see no FIN/RST
        ...
        cluster.heal("h3")

Every subprocess has a timeout; a failing script raises ClusterError carrying its output.
"""
import os
import shlex
import shutil
import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "cluster"
DEFAULT_DIR = "/tmp/mltrain-cluster"
NET = "10.231.0"


class ClusterError(RuntimeError):
    pass


def _index(h) -> int:
    """'h3', 'mlt-h3', 3 -> 3."""
    s = str(h)
    if s.startswith("mlt-"):
        s = s[4:]
    if s.startswith("h"):
        s = s[1:]
    if not s.isdigit() or int(s) < 1:
        raise ValueError(f"bad host {h!r} (want 'hK', e.g. 'h2')")
    return int(s)


def _run(args, timeout, check=True):
    try:
        p = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise ClusterError(f"{shlex.join(map(str, args))} timed out after {timeout} s\n{out}")
    if check and p.returncode != 0:
        raise ClusterError(f"{shlex.join(map(str, args))} exited {p.returncode}\n{p.stdout}")
    return p


_available = None


def available():
    """(True, "") if a cluster can be brought up here, else (False, reason) for pytest.skip."""
    global _available
    if _available is not None:
        return _available
    _available = _check_available()
    return _available


def _check_available():
    if os.geteuid() != 0:
        return False, "test cluster needs root (network namespaces, sshd on port 22)"
    for tool in ("ip", "ssh", "sftp", "ssh-keygen", "flock", "timeout"):
        if shutil.which(tool) is None:
            return False, f"test cluster needs '{tool}' (iproute2, openssh-client, util-linux)"
    if not os.access("/usr/sbin/sshd", os.X_OK):
        return False, "test cluster needs /usr/sbin/sshd (apt-get install openssh-server)"
    probe = f"mlt-probe{os.getpid()}"
    try:
        p = _run(["ip", "netns", "add", probe], timeout=10, check=False)
        if p.returncode != 0:
            return False, f"no network namespace support here: ip netns add: {p.stdout.strip()}"
        _run(["ip", "netns", "delete", probe], timeout=10, check=False)
    except ClusterError as e:
        return False, f"no network namespace support here: {e}"
    return True, ""


class Cluster:
    """A running test cluster. Make one with Cluster.up(); stop it with .down() (or `with`)."""

    def __init__(self, state_dir=DEFAULT_DIR):
        self.dir = Path(state_dir)
        self.ssh_config = self.dir / "ssh_config"
        self.known_hosts = self.dir / "known_hosts"
        self.hostfile = self.dir / "hostfile"
        self.identity = self.dir / "id_ed25519"
        self.authorized_keys = self.dir / "authorized_keys"
        self.hosts = []
        self._faults = set()
        env = self.dir / "env.sh"
        if env.exists():
            for line in env.read_text().splitlines():
                if line.startswith("export MLTRAIN_CLUSTER_HOSTS="):
                    self.hosts = line.split("=", 1)[1].strip("'\"").split()

    # -- lifecycle -------------------------------------------------------------------------------
    @classmethod
    def up(cls, n=4, max_sessions=None, state_dir=DEFAULT_DIR, timeout=120, hostnames=None, user=None,
           private_homes=False, etc_hosts=False, reuse=False):
        """Tear down any previous cluster and bring up n hosts h1..hn (tests/cluster/up.sh).

        max_sessions: {"h2": 2} (or {2: 2}) sets sshd MaxSessions on those hosts (default 10).
        hostnames: {"h1": "twin", "h2": "twin"} gives hosts their own `hostname` (default hK).
        user: the login user (default mltest); created with /bin/sh as its shell when missing.
        private_homes: every host has its own empty home folder (home(h) shows it here).
        etc_hosts: 'IP hK' lines in /etc/hosts, so host names resolve everywhere (down removes them).
        reuse: keep the network and keys of a cluster already up with at least n hosts; every
          host's processes are killed and its sshd started afresh with these settings (up.sh --reuse).
        Every host has its own /dev/shm, as separate machines do.
        """
        args = [str(SCRIPTS / "up.sh"), "-n", str(n), "-d", str(state_dir)]
        for h, m in (max_sessions or {}).items():
            args += ["--max-sessions", f"h{_index(h)}={int(m)}"]
        for h, name in (hostnames or {}).items():
            args += ["--hostname", f"h{_index(h)}={name}"]
        if user:
            args += ["--user", user]
        if private_homes:
            args += ["--private-homes"]
        if etc_hosts:
            args += ["--etc-hosts"]
        if reuse:
            args += ["--reuse"]
        _run(args, timeout=timeout)
        c = cls(state_dir)
        if len(c.hosts) != n:
            raise ClusterError(f"up.sh made {c.hosts}, expected {n} hosts")
        return c

    def down(self, timeout=60):
        """Kill everything on every host and remove namespaces, veths and bridge (idempotent)."""
        _run([str(SCRIPTS / "down.sh"), "-d", str(self.dir)], timeout=timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.down()
        return False

    # -- addressing --------------------------------------------------------------------------------
    def ip(self, h) -> str:
        """'h3' -> '10.231.0.13'."""
        return f"{NET}.{10 + _index(h)}"

    def home(self, h) -> Path:
        """Host h's own home folder, as this machine sees it (a cluster with private_homes)."""
        return self.dir / f"h{_index(h)}" / "home"

    def ns(self, h) -> str:
        """'h3' -> 'mlt-h3' (for `ip netns exec`)."""
        return f"mlt-h{_index(h)}"

    def env(self) -> dict:
        """The MLTRAIN_CLUSTER_* variables that env.sh exports."""
        return {
            "MLTRAIN_CLUSTER_DIR": str(self.dir),
            "MLTRAIN_CLUSTER_HOSTS": " ".join(self.hosts),
            "MLTRAIN_CLUSTER_SSH_CONFIG": str(self.ssh_config),
            "MLTRAIN_CLUSTER_KNOWN_HOSTS": str(self.known_hosts),
            "MLTRAIN_CLUSTER_HOSTFILE": str(self.hostfile),
        }

    # -- faults (tests/cluster/fault.sh) ---------------------------------------------------------
    def _fault(self, cmd, h, timeout=60):
        _run([str(SCRIPTS / "fault.sh"), "-d", str(self.dir), cmd, f"h{_index(h)}"], timeout=timeout)
        h = f"h{_index(h)}"
        if cmd in ("cut", "kill", "rekey", "forget"):
            self._faults.add((cmd, h))
        undone = {"heal": ("cut",), "revive": ("kill",), "trust": ("rekey", "forget")}.get(cmd, ())
        self._faults -= {(c, h) for c in undone}

    def undo_faults(self):
        """Undo what cut, kill, rekey and forget did and the test did not undo itself (conftest
        calls this after each test on the cluster): heal, revive, trust."""
        faults, self._faults = self._faults, set()
        for cmd, h in sorted(faults):
            if cmd == "cut":
                self._fault("heal", h)
            elif cmd == "kill" and not self._sshd_running(h):
                self._fault("revive", h)
        for h in sorted({h for cmd, h in faults if cmd in ("rekey", "forget")}):
            self._fault("trust", h)

    def _sshd_running(self, h) -> bool:
        try:
            pid = int((self.dir / f"h{_index(h)}" / "sshd.pid").read_text())
            os.kill(pid, 0)
            return True
        except (OSError, ValueError):
            return False

    def cut(self, h):
        """Silent network cut: packets to/from h vanish; TCP peers see no FIN/RST/ICMP and hang."""
        self._fault("cut", h)

    def heal(self, h):
        """Undo cut(h)."""
        self._fault("heal", h)

    def kill(self, h):
        """SIGKILL every process on h (its sshd, sessions, ranks). Its kernel still answers:
        new connections get 'Connection refused'. For a power-off, cut(h) first."""
        self._fault("kill", h)

    def revive(self, h):
        """Start h's sshd again after kill(h)."""
        self._fault("revive", h)

    def rekey(self, h):
        """New host key for h and restart its sshd: clients see a CHANGED host key."""
        self._fault("rekey", h)

    def forget(self, h):
        """Remove h from known_hosts: clients see an UNKNOWN host key."""
        self._fault("forget", h)

    def trust(self, h):
        """Put h's current host key back into known_hosts (undoes forget and rekey)."""
        self._fault("trust", h)

    # -- inspection --------------------------------------------------------------------------------
    def pids(self, h):
        """Pids of the processes now in h's namespace (`ip netns pids`)."""
        p = _run(["ip", "netns", "pids", self.ns(h)], timeout=10)
        return [int(x) for x in p.stdout.split() if x.isdigit()]

    def ssh_args(self, h):
        """argv prefix for ssh to h with the cluster's config: ssh_args('h2') + ['cmd']."""
        return ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", f"h{_index(h)}"]

    def run(self, h, cmd, timeout=30, check=False):
        """Run cmd (a shell string, or an argv list that gets quoted) on h over ssh.
        Returns CompletedProcess with text stdout and stderr; check=True raises on nonzero exit."""
        if not isinstance(cmd, str):
            cmd = shlex.join(map(str, cmd))
        args = self.ssh_args(h) + ["--", cmd]
        try:
            return subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout, check=check)
        except subprocess.CalledProcessError as e:
            raise ClusterError(f"on {h}: {cmd!r} exited {e.returncode}\n{e.stdout}{e.stderr}")
