"""Two projects on the same hosts never touch each other's files (issue 35, item 5), on the test
cluster with homes of their own: each project folder syncs into a folder of its own on the hosts,
keyed by its path and user, whatever its jobs are named or run."""
import re
from pathlib import Path

from conftest import communicate, wait_for, work_dir
from multihost_fixtures import mh, module_cluster, shared_root  # noqa: F401 (fixtures)

cluster = module_cluster(n=2, private_homes=True)


def project(root: Path, module: str, go: Path) -> Path:
    """A folder named `proj` (the same name for both projects) whose script imports its own module
    only when `go` exists, as a training script imports a helper after its first epoch."""
    p = root / "proj"
    p.mkdir(parents=True)
    (p / f"{module}.py").write_text(f"NAME = '{module}'\n")
    (p / "main.py").write_text(
        "import os, time\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.05)\n"
        f"import {module}\n"
        f"print('rank', os.environ['RANK'], 'imported', {module}.NAME, 'in', os.getcwd())\n")
    return p


def test_a_second_project_with_the_same_program_leaves_a_running_jobs_files_alone(mh, cluster):  # noqa: F811
    go_a, go_b = mh.shared / "go-a", mh.shared / "go-b"
    a = project(mh.shared / "a", "helper_a", go_a)
    b = project(mh.shared / "b", "helper_b", go_b)
    go_b.touch()
    # Job A runs (the same program, python3, from a folder of the same name) and waits.
    pa = mh.popen("--sync", "-H", "h1,h2", "--", "python3", "main.py", cwd=a)
    try:
        wait_for(lambda: all(work_dir(cluster.home(h), "proj").is_dir() and
                             (work_dir(cluster.home(h), "proj") / "helper_a.py").exists() for h in ("h1", "h2")),
                 60, "job A's files on both hosts")
        # Job B, from the other folder, runs to the end while A is still running.
        r = mh.run("--sync", "-H", "h1,h2", "--", "python3", "main.py", cwd=b, timeout=90)
        assert r.returncode == 0, r.stderr
        assert "removed" not in r.stderr, r.stderr
        for k in (0, 1):
            assert f"rank {k} imported helper_b" in r.stdout, r.stdout
        # A goes on and finds its own files.
        go_a.touch()
        out, err = communicate(pa, 90)
        assert pa.returncode == 0, err
        for k in (0, 1):
            assert f"rank {k} imported helper_a" in out, out
        dirs = {line.rsplit(" in ", 1)[1] for line in (out + r.stdout).splitlines() if " imported " in line}
        assert len(dirs) == 2, dirs  # one folder for each project, the same on both hosts' homes
    finally:
        go_a.touch()
        if pa.poll() is None:
            pa.kill()
            communicate(pa, 30)


def test_a_second_run_of_the_same_project_syncs_beside_the_one_that_runs(mh, cluster):  # noqa: F811
    """Run A of a project runs; run B of the same project (one file changed, one removed) syncs into
    a folder of its own beside A's (its unchanged files hard links to A's), runs its code, and A
    finishes with every file it started with."""
    go = mh.shared / "go-same"
    p = mh.shared / "same" / "proj"
    p.mkdir(parents=True)
    (p / "big.bin").write_bytes(b"x" * 100000)
    (p / "helper.py").write_text("VERSION = 'A'\n")
    (p / "gone.py").write_text("GONE = True\n")
    (p / "main.py").write_text(
        "import os, time\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.05)\n"
        "import helper, gone\n"
        "print('rank', os.environ['RANK'], 'ran', helper.VERSION, 'in', os.getcwd())\n")
    (p / "b.py").write_text("import helper, os\nprint('rank', os.environ['RANK'], 'ran', helper.VERSION, 'in', os.getcwd())\n")
    pa = mh.popen("--sync", "-H", "h1,h2", "--", "python3", "main.py", cwd=p)
    try:
        wait_for(lambda: all((work_dir(cluster.home(h), "proj") / "gone.py").exists() for h in ("h1", "h2")), 60,
                 "run A's files on both hosts")
        wait_for(lambda: len(mh.ml.run_dirs()) == 1 and "running" in (mh.ml.run_dirs()[0] / "run.json").read_text(),
                 60, "run A running")
        folder_a = work_dir(cluster.home("h1"), "proj")
        (p / "helper.py").write_text("VERSION = 'B'\n")
        (p / "gone.py").unlink()
        r = mh.run("--sync", "-H", "h1,h2", "--", "python3", "b.py", cwd=p, timeout=90)
        assert r.returncode == 0, r.stderr
        assert f"is in use by an older run; this run syncs into" in r.stderr, r.stderr
        for k in (0, 1):
            assert f"rank {k} ran B in /home/mltest/.cache/mltrain/work/{folder_a.name}@2" in r.stdout, r.stdout
        for h in ("h1", "h2"):
            a, b = work_dir(cluster.home(h), "proj"), cluster.home(h) / ".cache/mltrain/work" / (folder_a.name + "@2")
            assert (a / "gone.py").exists() and (a / "helper.py").read_text() == "VERSION = 'A'\n"
            assert not (b / "gone.py").exists() and (b / "helper.py").read_text() == "VERSION = 'B'\n"
            assert (a / "big.bin").stat().st_ino == (b / "big.bin").stat().st_ino  # not sent again
        # `mltrain ssh` of run B lands in B's own copy.
        c = mh.ml("ssh", "latest", "-r", "1", "--", "pwd", timeout=60)
        assert c.returncode == 0 and c.stdout.strip().endswith(folder_a.name + "@2"), (c.stdout, c.stderr)
        go.touch()
        out, err = communicate(pa, 90)
        assert pa.returncode == 0, err
        for k in (0, 1):
            assert f"rank {k} ran A in /home/mltest/.cache/mltrain/work/{folder_a.name}\n" in out, out
    finally:
        go.touch()
        if pa.poll() is None:
            pa.kill()
            communicate(pa, 30)


def test_gc_hosts_removes_the_synced_folders_no_run_uses(mh, cluster):  # noqa: F811
    go = mh.shared / "go-gc"
    done_p = mh.shared / "gc" / "finished"
    busy_p = mh.shared / "gc" / "running"
    for p in (done_p, busy_p):
        p.mkdir(parents=True)
        (p / "main.py").write_text(f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n")
    go.touch()
    r = mh.run("--sync", "-H", "h1,h2", "--", "python3", "main.py", cwd=done_p, timeout=90)
    assert r.returncode == 0, r.stderr
    go.unlink()
    pb = mh.popen("--sync", "-H", "h1,h2", "--", "python3", "main.py", cwd=busy_p)
    # What gc must never touch: a folder no sync made, and a link to a folder elsewhere.
    keep = cluster.home("h1") / ".cache/mltrain/work/mine"
    keep.mkdir(parents=True, exist_ok=True)
    (keep / "notes.txt").write_text("mine\n")
    outside = mh.shared / "outside"
    (outside / ".mltrain-sync").mkdir(parents=True)
    link = cluster.home("h1") / ".cache/mltrain/work/link-to-outside"
    if not link.exists():
        link.symlink_to(outside)
    try:
        wait_for(lambda: all(work_dir(cluster.home(h), "running").is_dir() for h in ("h1", "h2")), 60,
                 "the running job's folders")
        finished = {h: work_dir(cluster.home(h), "finished") for h in ("h1", "h2")}
        running = {h: work_dir(cluster.home(h), "running") for h in ("h1", "h2")}
        r = mh.ml("gc", "--hosts", *mh.args("-H", "h1,h2"), "--dry-run", timeout=90)
        assert r.returncode == 0, r.stderr
        for h in ("h1", "h2"):
            assert f"{h}: would remove {finished[h].name} (" in r.stdout, r.stdout
            assert re.search(rf"{h}: kept {running[h].name} \(in use by run \S+\)", r.stdout), r.stdout
            assert finished[h].is_dir()
        r = mh.ml("gc", "--hosts", *mh.args("-H", "h1,h2"), timeout=90)
        assert r.returncode == 0, r.stderr
        assert re.search(r"removed \d+ of \d+ synced folders", r.stdout), r.stdout
        for h in ("h1", "h2"):
            assert not finished[h].exists() and running[h].is_dir()
        assert (keep / "notes.txt").read_text() == "mine\n" and (outside / ".mltrain-sync").is_dir()
        assert link.is_symlink()
    finally:
        go.touch()
    out, err = communicate(pb, 90)
    assert pb.returncode == 0, err
