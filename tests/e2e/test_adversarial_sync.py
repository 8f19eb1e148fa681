"""Issue 31: what a sync may do to a host's files when the job, the host's user or another local
user changed things there. On localhost: the agent is the same as on a remote host.

Must hold: a sync never removes or writes outside its folder (no link is followed), never removes
what the job wrote, keeps the folder private to its user, and two syncs of one folder at once
both succeed with every file whole."""
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from conftest import communicate, work_dir


def project(ml, name="adv", remote=None, command="true"):
    p = ml.dir / name
    p.mkdir(exist_ok=True)
    dest = f'remote_dir = "{remote}"\n' if remote else ""
    (p / "job.toml").write_text(f'name = "{name}"\n[run]\ncommand = "{command}"\n[sync]\n{dest}')
    return p


def run(ml, p, env=None, timeout=60):
    return ml("run", p / "job.toml", env=env, timeout=timeout)


def test_a_sync_never_removes_through_a_folder_that_became_a_link(ml):
    remote, precious = ml.dir / "remote", ml.dir / "precious"
    p = project(ml, remote=remote)
    (p / "data").mkdir()
    (p / "data" / "a.txt").write_text("a\n")
    assert run(ml, p).returncode == 0
    # On the host, the synced folder is swapped for a link to something else of the user's.
    precious.mkdir()
    (precious / "a.txt").write_text("precious\n")
    for f in (remote / "data").iterdir():
        f.unlink()
    (remote / "data").rmdir()
    os.symlink(precious, remote / "data")
    # Locally the folder goes: the next sync removes what it put there, and nothing else.
    (p / "data" / "a.txt").unlink()
    (p / "data").rmdir()
    r = run(ml, p)
    assert r.returncode == 0, r.stderr
    assert (precious / "a.txt").read_text() == "precious\n"
    assert os.path.islink(remote / "data")  # not ours any more: kept too
    assert "removed" not in r.stderr, r.stderr


def test_a_sync_never_writes_through_a_link_on_the_way(ml):
    remote, precious = ml.dir / "remote", ml.dir / "precious"
    p = project(ml, remote=remote)
    (p / "conf").mkdir()
    (p / "conf" / "x.txt").write_text("v1\n")
    assert run(ml, p).returncode == 0
    precious.mkdir()
    (precious / "x.txt").write_text("precious\n")
    (remote / "conf" / "x.txt").unlink()
    (remote / "conf").rmdir()
    os.symlink(precious, remote / "conf")
    (p / "conf" / "x.txt").write_text("v2\n")
    r = run(ml, p)
    assert r.returncode == 255, r.stderr
    assert "conf/x.txt: a folder on its way is a link or a file here (not followed)" in r.stderr, r.stderr
    assert (precious / "x.txt").read_text() == "precious\n"


def test_a_sync_keeps_what_the_job_wrote_in_a_folder_that_is_now_a_file(ml):
    remote = ml.dir / "remote"
    p = project(ml, remote=remote, command="mkdir -p ckpt && echo w > ckpt/epoch-9.pt")
    (p / "ckpt").mkdir()
    (p / "ckpt" / "keep.txt").write_text("k\n")
    assert run(ml, p).returncode == 0
    assert (remote / "ckpt" / "epoch-9.pt").read_text() == "w\n"
    (p / "ckpt" / "keep.txt").unlink()
    (p / "ckpt").rmdir()
    (p / "ckpt").write_text("now a file\n")
    r = run(ml, p)
    assert r.returncode == 255, r.stderr
    assert "ckpt is a file in your folder, but here it is a folder holding what the job wrote " \
           "(ckpt/epoch-9.pt)" in r.stderr, r.stderr
    assert (remote / "ckpt" / "epoch-9.pt").read_text() == "w\n"


def test_a_sync_keeps_a_file_the_job_wrote_where_your_folder_now_has_a_folder(ml):
    remote = ml.dir / "remote"
    p = project(ml, remote=remote, command="echo w > result")
    assert run(ml, p).returncode == 0
    (p / "result").mkdir()
    (p / "result" / "x").write_text("x\n")
    r = run(ml, p)
    assert r.returncode == 255 and "result is a folder in your folder, but here it is a file the job wrote" in r.stderr
    assert (remote / "result").read_text() == "w\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="reads as another user (nobody): needs root")
def test_the_synced_folder_and_its_secrets_are_private_to_the_user(ml):
    home = ml.dir / "userhome"
    home.mkdir()
    home.chmod(0o755)
    p = project(ml, name="secretjob")
    (p / "job.toml").write_text((p / "job.toml").read_text() + '[run.env]\nWANDB_API_KEY = "wk-123456"\n')
    r = run(ml, p, env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    folder = work_dir(home, "secretjob")
    assert (folder / "job.toml").exists()
    assert folder.stat().st_mode & 0o077 == 0, oct(folder.stat().st_mode)
    peek = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat",
                           str(folder / "job.toml")], capture_output=True, text=True)
    assert peek.returncode != 0 and "wk-123456" not in peek.stdout, peek.stdout
    # A folder an older version left readable is made private again on the next sync.
    folder.chmod(0o755)
    assert run(ml, p, env={"HOME": str(home)}).returncode == 0
    assert folder.stat().st_mode & 0o077 == 0, oct(folder.stat().st_mode)


def test_two_syncs_of_one_folder_at_once_both_succeed_with_whole_files(ml):
    remote = ml.dir / "remote"
    versions = {}
    projects = []
    for v in ("a", "b"):
        p = project(ml, name=f"race{v}", remote=remote)
        (p / "src").mkdir()
        for k in range(40):
            (p / "src" / f"f{k}.bin").write_bytes(v.encode() * (50000 + k))
        versions[v] = {f"f{k}.bin": v.encode() * (50000 + k) for k in range(40)}
        projects.append(p)
    for round_ in range(10):
        procs = [ml.popen("run", p / "job.toml") for p in projects]
        results = [communicate(q, 120) for q in procs]
        for q, (out, err) in zip(procs, results):
            assert q.returncode == 0, f"round {round_}: {err}"
        for k in range(40):
            got = (remote / "src" / f"f{k}.bin").read_bytes()
            assert got in (versions["a"][f"f{k}.bin"], versions["b"][f"f{k}.bin"]), f"round {round_}: f{k} mixed"
        # The index, and which runs held the folder (in-use/<run id>: a run that syncs while an
        # older one runs there goes to a folder of its own, docs/sync.md); no work folder is left.
        assert [n for n in os.listdir(remote / ".mltrain-sync") if n not in ("index", "in-use")] == [], \
            os.listdir(remote / ".mltrain-sync")


# ---- hosts that share one home folder (NFS homes): every host syncs into the same folder ----

from multihost_fixtures import mh, module_cluster, shared_root  # noqa: E402,F401 (fixtures)

cluster = module_cluster(n=3)  # the cluster's default: one home for every host


def test_20_first_syncs_on_3_hosts_sharing_a_home_all_succeed(mh, cluster):  # noqa: F811
    for k in range(20):
        p = mh.shared / f"first{k}"
        (p / "src").mkdir(parents=True)
        for i in range(30):
            (p / "src" / f"m{i}.py").write_text(f"V = {k}.{i}\n" * 200)
        (p / "job.toml").write_text(f'name = "first{k}"\n[run]\ncommand = "cat src/m7.py | head -1"\n[sync]\n')
        r = mh.run(p / "job.toml", "-H", "h1,h2,h3", timeout=120)
        assert r.returncode == 0, f"sync {k}: {r.stderr}"
        assert r.stdout.count(f"V = {k}.7") == 3, r.stdout
        folder = work_dir(pwd.getpwnam("mltest").pw_dir, f"first{k}")
        assert (folder / "src" / "m29.py").read_text() == f"V = {k}.29\n" * 200
