"""Remote login shells: sshd hands the agent's start command to the user's login shell, whatever it
is (fish, tcsh, zsh, bash), after its startup files ran and maybe printed a banner; and the
cached agent must be verified, or replaced, on a host without sha256sum.

A cluster of its own, logging in as a user of its own (mltshell), whose login shell and startup
files each test sets and the `login` fixture restores, so other modules' user (mltest) is never
touched. Hosts share the file system: the user's home and /etc/passwd are the same on h1 and h2.
"""
import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from multihost_fixtures import cached_agent_path, mh, module_cluster, shared_root  # noqa: F401

USER = "mltshell"
BANNER = "Welcome to the login banner of this host"
# The digest tools the bootstrap script can use; a host "without sha256sum" lacks the first only.
DIGESTS = ("sha256sum", "shasum", "openssl", "busybox", "python3", "python3.11", "perl")


def set_shell(shell):
    subprocess.run(["usermod", "-s", shell, USER], check=True, timeout=30, capture_output=True)


cluster = module_cluster(n=2, user=USER, before_down=lambda: set_shell("/bin/sh"))


@pytest.fixture(scope="module")
def bins():
    """Login shells whose PATH lacks digest tools: {"nosha": ..., "nodigest": ...}, each a script
    that sets PATH to a folder of links to /usr/bin's programs but those, then runs /bin/sh."""
    root = Path(tempfile.mkdtemp(prefix="mlt-shells-", dir="/tmp"))
    root.chmod(0o755)
    shells = {}
    for name, missing in (("nosha", DIGESTS[:1]), ("nodigest", DIGESTS)):
        d = root / name
        d.mkdir()
        for entry in os.scandir("/usr/bin"):
            if entry.name not in missing and not entry.name.startswith("python"):
                (d / entry.name).symlink_to(entry.path)
        if name == "nosha":
            (d / "python3").symlink_to("/usr/bin/python3")
        sh = root / f"{name}-sh"
        sh.write_text(f"#!/bin/sh\nPATH={d}; export PATH\nexec /bin/sh \"$@\"\n")
        sh.chmod(0o755)
        shells[name] = str(sh)
    yield shells
    shutil.rmtree(root, ignore_errors=True)


class Login:
    """Sets the test user's login shell and startup files; undoes it all at the end."""

    def __init__(self):
        pw = pwd.getpwnam(USER)
        self.home = Path(pw.pw_dir)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        self.written = []
        self.saved = {}
        shutil.rmtree(self.home / ".cache" / "mltrain", ignore_errors=True)

    def shell(self, shell):
        set_shell(shell)

    def write(self, rel, text):
        p = self.home / rel
        if p.exists() and rel not in self.saved:
            self.saved[rel] = p.read_bytes()
        p.parent.mkdir(parents=True, exist_ok=True)
        for d in p.relative_to(self.home).parents:
            os.chown(self.home / d, self.uid, self.gid)
        p.write_text(text)
        os.chown(p, self.uid, self.gid)
        self.written.append(p)

    def restore(self):
        set_shell("/bin/sh")
        for p in self.written:
            p.unlink(missing_ok=True)
        for rel, data in self.saved.items():
            (self.home / rel).write_bytes(data)
        shutil.rmtree(self.home / ".config" / "fish", ignore_errors=True)
        # A damaged agent left behind must not be the next test's (or another binary's) start.
        shutil.rmtree(self.home / ".cache" / "mltrain", ignore_errors=True)


@pytest.fixture
def login(cluster):
    lg = Login()
    try:
        yield lg
    finally:
        lg.restore()


def need(shell):
    if not os.access(shell, os.X_OK):
        pytest.skip(f"{shell} is not installed (scripts/setup.sh --test-deps installs it)")


def ranks_said(p):
    return sorted(l.split("] ", 1)[1] for l in p.stdout.splitlines() if "] r" in l)


def run_job(mh):
    return mh.run("-H", "h1:2,h2:2", "--workdir", "/tmp", "--", "sh", "-c", 'echo "r$RANK $(hostname)"')


def assert_ran(mh, p):
    assert p.returncode == 0, p.stderr
    assert ranks_said(p) == ["r0 h1", "r1 h1", "r2 h2", "r3 h2"], p.stdout
    assert BANNER not in p.stdout + p.stderr
    for r in range(4):
        assert BANNER not in mh.rank_log(r)


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def damage_same_size(path):
    """The agent with its ELF header zeroed: same size, owner and mode, cannot run. Put in by
    rename (an agent still exiting keeps the old file busy)."""
    st = os.stat(path)
    data = Path(path).read_bytes()
    tmp = Path(f"{path}.damaged")
    tmp.write_bytes(b"\0" * 64 + data[64:])
    os.chown(tmp, st.st_uid, st.st_gid)
    tmp.chmod(st.st_mode & 0o7777)
    os.replace(tmp, path)
    assert os.path.getsize(path) == st.st_size


# -- login shells ------------------------------------------------------------------------------

def test_fish_login_shell(mh, login):
    need("/usr/bin/fish")
    login.shell("/usr/bin/fish")
    assert_ran(mh, run_job(mh))


def test_tcsh_login_shell(mh, login):
    need("/usr/bin/tcsh")
    login.shell("/usr/bin/tcsh")
    assert_ran(mh, run_job(mh))


@pytest.mark.parametrize("shell,rc", [
    ("/bin/bash", ".bashrc"),                    # bash reads it for commands sshd runs
    ("/usr/bin/zsh", ".zshenv"),
    ("/usr/bin/fish", ".config/fish/config.fish"),
    ("/usr/bin/tcsh", ".tcshrc"),
])
def test_startup_file_banner(mh, login, shell, rc):
    need(shell)
    login.shell(shell)
    # The last line lacks its newline: the marker must still be found.
    login.write(rc, f"echo '{BANNER}'\necho 'and a second line'\nprintf 'no newline'\n")
    assert_ran(mh, run_job(mh))


def test_a_startup_file_that_stops_the_command_is_shown(mh, login):
    login.shell("/bin/bash")
    login.write(".bashrc", "echo 'this host is closed for maintenance'\nexit 1\n")
    p = mh.run("-H", "h1:1", "--workdir", "/tmp", "--", "true")
    assert p.returncode == 255, p.stderr
    assert "this host is closed for maintenance" in p.stderr, p.stderr
    assert "~/.bashrc" in p.stderr, p.stderr
    assert "POSIX sh" not in p.stderr, p.stderr


# -- hosts without sha256sum ---------------------------------------------------------------------

def test_without_sha256sum_another_digest_repairs_a_same_size_damaged_agent(mh, login, bins):
    login.shell(bins["nosha"])
    path = cached_agent_path(mh)
    good, ino = sha256(path), os.stat(path).st_ino
    assert_ran(mh, run_job(mh))
    assert os.stat(path).st_ino == ino, "a verified agent was uploaded again"
    damage_same_size(path)
    assert_ran(mh, run_job(mh))
    assert sha256(path) == good


def test_without_any_digest_tool_the_agent_is_uploaded(mh, login, bins):
    login.shell(bins["nodigest"])
    path = cached_agent_path(mh)
    good = sha256(path)
    damage_same_size(path)
    assert_ran(mh, run_job(mh))
    assert sha256(path) == good


def test_a_damaged_agent_it_cannot_replace_is_said(mh, login, bins):
    login.shell(bins["nodigest"])
    path = cached_agent_path(mh)
    damage_same_size(path)
    cache = Path(path).parent
    os.chown(cache, 0, 0)     # the user can no longer replace what is in it
    cache.chmod(0o755)
    p = mh.run("-H", "h1:1", "--workdir", "/tmp", "--", "true")
    assert p.returncode == 255, p.stderr
    assert "h1: cannot write the agent to ~/.cache/mltrain/mltrain-agent-" in p.stderr, p.stderr
    assert "Permission denied" in p.stderr, p.stderr
    assert "permissions of ~/.cache/mltrain" in p.stderr, p.stderr
