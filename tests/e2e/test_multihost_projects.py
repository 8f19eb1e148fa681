"""Two projects on the same hosts never touch each other's files (issue 35, item 5), on the test
cluster with homes of their own: each project folder syncs into a folder of its own on the hosts,
keyed by its path and user, whatever its jobs are named or run."""
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
