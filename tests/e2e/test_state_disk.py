"""Issue 16, item 6: a full, read-only or noexec MLTRAIN_HOME. Records are written whole or not at
all (the last good run.json stays), cut logs are said loudly and a run that succeeded exits 74, a
read-only state folder is a clean error that leaves no run folder, a noexec one still runs.

Mounts small tmpfs folders: needs root (skipped otherwise)."""
import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")


@pytest.fixture
def small_home(ml, tmp_path):
    mounts = []

    def mount(opts):
        d = tmp_path / f"home{len(mounts)}"
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)], check=True)
        mounts.append(d)
        return d

    yield mount
    for d in reversed(mounts):
        subprocess.run(["umount", "-l", str(d)], check=False)


def _fill(home, leave):
    st = os.statvfs(home)
    free = st.f_bavail * st.f_frsize
    with open(home / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def test_full_disk_cuts_logs_loudly_and_keeps_the_record(ml, small_home):
    home = small_home("size=4m")
    env = {"MLTRAIN_HOME": str(home)}
    assert ml("run", "-n", "1", "--", "true", env=env).returncode == 0  # agent installed, one record
    _fill(home, 48 << 10)
    r = ml("run", "-n", "2", "--", "sh", "-c", 'head -c 2000000 /dev/zero | tr "\\0" x | fold -w 100',
           env=env, timeout=60)
    assert r.returncode == 74, r.stderr[-2000:]
    assert "rank log cut: " in r.stderr and "No space left on device" in r.stderr, r.stderr[-2000:]
    assert "records are incomplete (exit code 74)" in r.stderr
    # Every run.json left is whole JSON: never a 0-byte or half file renamed over a good one.
    runs = sorted((home / "runs").iterdir())
    assert len(runs) == 2
    for d in runs:
        doc = json.loads((d / "run.json").read_text())
        assert doc["id"] == d.name
    assert not list((home / "runs").glob("*/.run.json.tmp*"))
    ls = ml("ls", "--json", env=env)
    assert ls.returncode == 0 and len(json.loads(ls.stdout)["runs"]) == 2


def test_full_disk_before_the_start_is_a_clean_error(ml, small_home):
    home = small_home("size=4m")
    env = {"MLTRAIN_HOME": str(home)}
    assert ml("run", "-n", "1", "--", "true", env=env).returncode == 0
    _fill(home, 0)
    r = ml("run", "-n", "1", "--", "true", env=env)
    assert r.returncode == 74, r.stderr
    assert "cannot write the run's record" in r.stderr and "MLTRAIN_HOME" in r.stderr
    assert len(list((home / "runs").iterdir())) == 1  # no empty run folder left behind


def test_read_only_home_is_a_clean_error(ml, small_home):
    home = small_home("size=1m,ro")
    r = ml("run", "-n", "1", "--", "true", env={"MLTRAIN_HOME": str(home)})
    assert r.returncode == 74, r.stderr
    assert "Read-only file system" in r.stderr and "set MLTRAIN_HOME to a writable folder" in r.stderr
    assert "bug" not in r.stderr
    assert os.listdir(home) == []


def test_noexec_home_still_runs(ml, small_home):
    home = small_home("size=8m,noexec")
    r = ml("run", "-n", "2", "--", "sh", "-c", "echo hi $RANK", env={"MLTRAIN_HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()[:2]) == ["[0] hi 0", "[1] hi 1"]
