"""[sync], [setup] and pull on the test cluster with no shared files: every host has a home of its
own (tests/cluster --private-homes), so a job's code exists only where the launcher is until
mltrain mirrors it. What lands on a host is read from its home folder (cluster.home(h))."""
import hashlib
import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

from conftest import communicate, wait_for, work_dir
from multihost_fixtures import mh, module_cluster, shared_root  # noqa: F401 (fixtures)

# `mh` takes this module's cluster: hosts with homes of their own.
cluster = module_cluster(n=4, private_homes=True)
HOSTS = ["h1", "h2", "h3", "h4"]


def project(root: Path, name: str, command: str, extra: str = "") -> Path:
    """A job folder that exists only here: job.toml, code, and things that must not travel."""
    p = root / name
    (p / "src").mkdir(parents=True)
    (p / "job.toml").write_text(f'name = "{name}"\n[run]\ncommand = """{command}"""\n[sync]\n'
                                'exclude = ["*.secret"]\n' + extra)
    (p / "src" / "model.py").write_text("VERSION = 1\n")
    (p / "src" / "data.txt").write_text("keep me\n" * 100)
    (p / "train.sh").write_text("#!/bin/sh\necho \"train on $(hostname) rank $RANK: $(cat src/model.py)\"\n")
    (p / "train.sh").chmod(0o755)
    os.symlink("src/model.py", p / "model_link.py")
    (p / ".gitignore").write_text("outputs/\n*.log\n")
    (p / ".mltrainignore").write_text("big-local-data/\n")
    (p / "debug.log").write_text("ignored by .gitignore\n")
    (p / "api.secret").write_text("ignored by exclude\n")
    (p / "big-local-data").mkdir()
    (p / "big-local-data" / "x.bin").write_text("ignored by .mltrainignore\n")
    return p


def synced(cluster, h, name) -> Path:  # noqa: F811
    return work_dir(cluster.home(h), name)


def run(mh, spec, *args, timeout=120):
    return mh.run(spec, "-H", ",".join(HOSTS), *args, timeout=timeout)


def summary(stderr: str) -> str:
    m = re.search(r"^mltrain: synced .*$", stderr, re.M)
    assert m, stderr
    return m[0]


def test_code_only_on_the_launcher_runs_after_a_sync_and_only_changes_travel(mh, cluster):  # noqa: F811
    p = project(mh.shared, "jobsync", "./train.sh")
    for h in HOSTS:
        assert not synced(cluster, h, "jobsync").exists()

    r = run(mh, p / "job.toml")
    assert r.returncode == 0, r.stderr
    for k, h in enumerate(HOSTS):
        assert f"train on {h} rank {k}: VERSION = 1" in r.stdout, r.stdout
    s = summary(r.stderr)
    assert re.search(r"to ~/\.cache/mltrain/work/jobsync-[0-9a-f]{8} on 4 hosts", s) and "6 files sent to each" in s, s
    for h in HOSTS:
        d = synced(cluster, h, "jobsync")
        assert sorted(str(f.relative_to(d)) for f in d.rglob("*") if ".mltrain-sync" not in f.parts) == [
            ".gitignore", ".mltrainignore", "job.toml", "model_link.py", "src", "src/data.txt", "src/model.py",
            "train.sh"], h
        # The link and the executable bit arrive as they are.
        assert os.readlink(d / "model_link.py") == "src/model.py"
        assert stat.S_IMODE((d / "train.sh").stat().st_mode) == 0o755
        assert stat.S_IMODE((d / "src" / "data.txt").stat().st_mode) == 0o644
        assert (d / "src" / "data.txt").stat().st_mtime == (p / "src" / "data.txt").stat().st_mtime

    # Nothing changed: nothing travels.
    inode = (synced(cluster, "h2", "jobsync") / "src" / "data.txt").stat().st_ino
    r = run(mh, p / "job.toml")
    assert r.returncode == 0, r.stderr
    assert "nothing changed" in summary(r.stderr), r.stderr

    # One file changed, one deleted; a file the job wrote on a host stays.
    (p / "src" / "model.py").write_text("VERSION = 2\n")
    (p / "src" / "data.txt").unlink()
    (synced(cluster, "h3", "jobsync") / "src" / "written-by-the-job.txt").write_text("mine\n")
    r = run(mh, p / "job.toml")
    assert r.returncode == 0, r.stderr
    s = summary(r.stderr)
    assert "1 file sent to each" in s and "1 removed on each" in s, s
    assert "train on h4 rank 3: VERSION = 2" in r.stdout, r.stdout
    for h in HOSTS:
        d = synced(cluster, h, "jobsync")
        assert (d / "src" / "model.py").read_text() == "VERSION = 2\n"
        assert not (d / "src" / "data.txt").exists(), h
    assert (synced(cluster, "h3", "jobsync") / "src" / "written-by-the-job.txt").exists()
    assert inode  # (a file the sync rewrote gets a new inode: the rename)


def test_setup_runs_once_again_after_a_change_and_a_failure_starts_nothing(mh, cluster):  # noqa: F811
    setup = '[setup]\ncommand = "echo setting up on $(hostname); echo run >> ~/setup-count"\n'
    p = project(mh.shared, "jobsetup", "./train.sh", setup)
    r = run(mh, p / "job.toml")
    assert r.returncode == 0, r.stderr
    for h in HOSTS:
        assert f"[{h}] setting up on {h}" in r.stderr, r.stderr
        assert (cluster.home(h) / "setup-count").read_text() == "run\n"
    rd = mh.latest_run_dir()
    assert "setting up on h2" in (rd / "setup-h2.log").read_text()

    r = run(mh, p / "job.toml")
    assert r.returncode == 0, r.stderr
    assert "setting up" not in r.stderr and "[h1] setup: skipped" in r.stderr, r.stderr
    for h in HOSTS:
        assert (cluster.home(h) / "setup-count").read_text() == "run\n"

    # A changed command runs again.
    (p / "job.toml").write_text((p / "job.toml").read_text().replace("setting up", "setting up again"))
    r = run(mh, p / "job.toml")
    assert r.returncode == 0, r.stderr
    for h in HOSTS:
        assert (cluster.home(h) / "setup-count").read_text() == "run\nrun\n"

    # A setup that fails on one host: nothing starts anywhere, the host and its last lines named.
    failing = ('[setup]\ncommand = "if [ $(hostname) = h3 ]; then echo cannot install torch; exit 3; fi; '
               'sleep 1"\n')
    q = project(mh.shared, "jobsetupfail", f"touch {mh.shared}/started-$RANK", failing)
    r = run(mh, q / "job.toml")
    assert r.returncode == 255, r.stderr
    assert "preflight failed on 1 of 4 hosts; no rank was started" in r.stderr, r.stderr
    assert re.search(r"h3: setup `.*` failed with exit code 3; its last lines:\n\s+\| cannot install torch",
                     r.stderr), r.stderr
    assert not list(mh.shared.glob("started-*"))


def test_a_sync_killed_halfway_leaves_no_partial_file_and_the_next_completes_it(mh, cluster):  # noqa: F811
    p = project(mh.shared, "jobkill", "./train.sh")
    big = p / "src" / "weights.bin"
    with open(big, "wb") as f:
        f.write(os.urandom(96 << 20))  # incompressible: it takes a while over four links
    want = hashlib.sha256(big.read_bytes()).hexdigest()
    proc = mh.popen(p / "job.toml", "-H", ",".join(HOSTS))
    # Kill the launcher while a host has the file half-written under its temporary name (the
    # synced folder's name is known once the sync made it).
    def partial():
        for d in (synced(cluster, h, "jobkill") / ".mltrain-sync" for h in HOSTS):
            try:
                if any(f.name.startswith("tmp-") and f.stat().st_size > 0 for f in d.iterdir()):
                    return True
            except OSError:
                pass
        return False
    wait_for(partial, 60, "a file half-written on a host", step=0.01)
    proc.send_signal(signal.SIGKILL)
    communicate(proc, 30)
    time.sleep(1)  # the agents see their stream close and leave
    for h in HOSTS:
        w = synced(cluster, h, "jobkill") / "src" / "weights.bin"
        # Never a partial file under its real name: absent, or whole.
        assert not w.exists() or hashlib.sha256(w.read_bytes()).hexdigest() == want, h

    r = run(mh, p / "job.toml")
    assert r.returncode == 0, r.stderr
    for h in HOSTS:
        d = synced(cluster, h, "jobkill")
        assert hashlib.sha256((d / "src" / "weights.bin").read_bytes()).hexdigest() == want, h
        assert not [f for f in (d / ".mltrain-sync").iterdir() if f.name.startswith("tmp-")], h


def test_pull_brings_outputs_back_whatever_the_outcome(mh, cluster):  # noqa: F811
    cmd = ("mkdir -p outputs && echo \"from $(hostname)\" > outputs/result-$RANK.txt && "
           "echo ckpt > model-$RANK.ckpt && if [ $RANK = 1 ]; then sleep 1; exit 3; fi")
    p = project(mh.shared, "jobpull", cmd, 'pull = ["outputs/", "*.ckpt"]\n')
    r = run(mh, p / "job.toml")
    assert r.returncode == 3, r.stderr
    assert "mltrain: pulled 8 files" in r.stderr, r.stderr
    pulled = mh.latest_run_dir() / "pulled"
    for k, h in enumerate(HOSTS):
        assert (pulled / h / "outputs" / f"result-{k}.txt").read_text() == f"from {h}\n"
        assert (pulled / h / f"model-{k}.ckpt").read_text() == "ckpt\n"

    # From rank 0's host only, into pulled/ itself.
    (p / "job.toml").write_text((p / "job.toml").read_text() + 'pull_from = "rank0"\n')
    r = run(mh, p / "job.toml")
    pulled = mh.latest_run_dir() / "pulled"
    assert sorted(str(f.relative_to(pulled)) for f in pulled.rglob("*") if f.is_file()) == [
        "model-0.ckpt", "outputs/result-0.txt"], r.stderr


def test_cp_and_ssh_reach_a_rank_in_its_synced_folder(mh, cluster, tmp_path):  # noqa: F811
    cmd = "mkdir -p outputs/deep && echo \"$RANK on $(hostname)\" > outputs/deep/r.txt && echo top > outputs/a.txt"
    p = project(mh.shared, "jobcp", cmd)
    r = run(mh, p / "job.toml")
    assert r.returncode == 0, r.stderr
    # A folder from rank 2's host (h3), as cp -r puts it: into an existing folder by its name.
    c = mh.ml("cp", "latest:2:outputs/", tmp_path, *mh.args(), timeout=60)
    assert c.returncode == 0, c.stderr
    assert (tmp_path / "outputs" / "deep" / "r.txt").read_text() == "2 on h3\n"
    assert (tmp_path / "outputs" / "a.txt").read_text() == "top\n"
    # One file to a new name; a path that is not there: exit 1, named.
    c = mh.ml("cp", "latest:1:src/model.py", tmp_path / "m.py", *mh.args(), timeout=60)
    assert c.returncode == 0 and (tmp_path / "m.py").read_text() == "VERSION = 1\n", c.stderr
    c = mh.ml("cp", "latest:nothing-here", tmp_path, *mh.args(), timeout=60)
    assert c.returncode == 1 and "nothing-here: No such file or directory" in c.stderr, c.stderr
    # ssh lands in the synced folder below that host's own home.
    c = mh.ml("ssh", "latest", "-r", "3", *mh.args(), "--", 'echo "$(hostname) $(pwd)"', timeout=60)
    assert c.returncode == 0, c.stderr
    assert c.stdout.strip() == "h4 /home/mltest/.cache/mltrain/work/" + synced(cluster, "h4", "jobcp").name, c.stdout


def test_rerun_runs_its_run_s_code_on_every_host_after_the_project_changed_and_is_gone(mh, cluster):  # noqa: F811
    import shutil
    p = project(mh.shared, "again", "./train.sh", "[metrics]\npattern = 'VERSION = (?P<version>[0-9]+)'\n")
    r = run(mh, p / "job.toml")
    assert r.returncode == 0, r.stderr
    a = mh.show()["id"]
    (p / "src" / "model.py").write_text("VERSION = 2\n")
    (p / "src" / "data.txt").unlink()
    r = run(mh, p / "job.toml")
    assert r.returncode == 0 and r.stdout.count("VERSION = 2") == 4, r.stdout
    for h in HOSTS:
        assert not (synced(cluster, h, "again") / "src" / "data.txt").exists()
    b = mh.show()["id"]
    d = mh.ml("diff", a, b)
    assert d.returncode == 0, d.stderr
    assert "-VERSION = 1\n+VERSION = 2" in d.stdout and "  removed  src/data.txt" in d.stdout, d.stdout
    # The pattern read rank 0's version from its output; each host's kernel is one row for all.
    assert "* version   1 / 1                    2 / 2" in d.stdout, d.stdout
    assert re.search(r"^  kernel +\S+ += *$", d.stdout, re.M), d.stdout
    assert "environment (every host, unless named)" in mh.ml("show", b).stdout

    def rerun_prints_version_1():
        # The recorded spec keeps the hosts (-H) and the ssh config: rerun needs nothing more.
        r = mh.ml("rerun", a, timeout=120)
        assert r.returncode == 0, r.stderr
        for k, h in enumerate(HOSTS):
            assert f"train on {h} rank {k}: VERSION = 1" in r.stdout, r.stdout
        assert mh.show()["rerun_of"] == a
        for h in HOSTS:  # the deleted file is back where the run's ranks ran
            assert (synced(cluster, h, "again") / "src" / "data.txt").read_text() == "keep me\n" * 100

    rerun_prints_version_1()
    shutil.rmtree(p)
    rerun_prints_version_1()


def test_gigabytes_of_zeros_sync_while_the_host_answers_heartbeats(mh, cluster):  # noqa: F811
    """Issue 47 item 4: zeros compress about 10,000 to 1, so a launcher that paced a sync by its
    bytes on the wire queued gigabytes of decompressing and writing ahead of a heartbeat's
    answer: a 3 GiB file failed with "stopped answering heartbeats while syncing". Paced by what
    the host says it wrote, its answers stay prompt (a 2 s heartbeat timeout here, 10 s by default)."""
    p = mh.shared / "zeros"
    p.mkdir()
    (p / "job.toml").write_text('name = "zeros"\n[run]\ncommand = "stat -c \'size %s\' data.bin"\n[sync]\n')
    with open(p / "data.bin", "wb") as f:
        f.truncate(2 << 30)  # sparse here; written whole on the host
    try:
        r = mh.run(p / "job.toml", "-H", "h1", timeout=240,
                   env={"MLTRAIN_HEARTBEAT_TIMEOUT": "2s", "MLTRAIN_HEARTBEAT_INTERVAL": "500ms"})
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"[h1:0] size {2 << 30}" in r.stdout, r.stdout
        assert "2 files sent (2048.0 MiB" in summary(r.stderr), r.stderr
    finally:
        for d in synced(cluster, "h1", "zeros").parent.glob("zeros-*"):
            subprocess.run(["rm", "-rf", str(d)], check=False)
