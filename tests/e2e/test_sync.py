"""[sync], [setup] and pull on localhost (the same code path as remote hosts: localhost is synced
too), with the synced folder under the test's own tmp folder. The multi-host side, with hosts
that share no files, the SIGKILL mid-sync and cp/ssh: test_multihost_sync.py."""
import os
import re
import shutil
from pathlib import Path

from conftest import work_dir


def project(ml, extra=""):
    p = ml.dir / "proj"
    (p / "src").mkdir(parents=True)
    remote = ml.dir / "remote"
    (p / "job.toml").write_text(
        'name = "loc"\n[run]\ncommand = "echo rank $RANK in $(pwd): $(cat src/v.txt); '
        'mkdir -p out && echo $RANK > out/r$RANK.txt"\n[cluster]\nnprocs = 2\n'
        f'[sync]\nremote_dir = "{remote}"\npull = ["out/"]\n' + extra)
    (p / "src" / "v.txt").write_text("one\n")
    (p / "notes.log").write_text("not synced\n")
    (p / ".mltrainignore").write_text("*.log\n")
    return p, remote


def synced_line(stderr):
    m = re.search(r"^mltrain: synced .*$", stderr, re.M)
    assert m, stderr
    return m[0]


def test_a_local_run_syncs_runs_in_the_copy_and_pulls_back(ml):
    p, remote = project(ml, '[setup]\ncommand = "echo prepared >> setup.txt"\n')
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"rank 0 in {remote}: one" in r.stdout and f"rank 1 in {remote}: one" in r.stdout, r.stdout
    assert "3 files sent" in synced_line(r.stderr), r.stderr  # job.toml, .mltrainignore, src/v.txt
    assert not (remote / "notes.log").exists()
    assert (remote / "setup.txt").read_text() == "prepared\n"
    run_dir = ml.run_dirs()[-1]
    assert sorted(f.name for f in (run_dir / "pulled" / "localhost" / "out").iterdir()) == ["r0.txt", "r1.txt"]
    assert (run_dir / "setup-localhost.log").read_text() == ""  # it said nothing

    (p / "src" / "v.txt").write_text("two\n")
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "1 file sent" in synced_line(r.stderr) and "rank 1 in" in r.stdout and ": two" in r.stdout, r.stderr
    # The tree changed, so the setup ran again; the job's own out/ was not deleted by the sync.
    assert (remote / "setup.txt").read_text() == "prepared\nprepared\n"
    assert (remote / "out" / "r0.txt").exists()

    r = ml("run", "--no-sync", "--setup", "never", "--workdir", p, p / "job.toml", timeout=60)
    assert r.returncode == 0 and "synced" not in r.stderr and f"in {p}: two" in r.stdout, r.stderr


def test_rank_0s_checkpoint_folder_comes_back_with_the_results(ml):
    p, remote = project(ml)
    job = p / "job.toml"
    job.write_text(job.read_text().replace(
        'echo $RANK > out/r$RANK.txt"',
        'echo $RANK > out/r$RANK.txt; [ $RANK = 1 ] || echo step 7 > $MLTRAIN_CHECKPOINT_DIR/last.txt"'))
    r = ml("run", job, timeout=60)
    assert r.returncode == 0, r.stderr
    run_dir = ml.run_dirs()[-1]
    assert (run_dir / "checkpoint" / "last.txt").read_text() == "step 7\n"
    assert re.search(r"pulled the checkpoint folder, 1 file \(.*\), into .*/checkpoint", r.stderr), r.stderr
    on_host = Path.home() / ".cache/mltrain/checkpoints" / run_dir.name
    assert (on_host / "last.txt").exists() and on_host.stat().st_mode & 0o777 == 0o700
    shutil.rmtree(on_host)

    # A run that wrote no checkpoint leaves no folder behind on its hosts.
    job.write_text(job.read_text().replace("step 7 > $MLTRAIN_CHECKPOINT_DIR/last.txt", "no checkpoint"))
    r = ml("run", job, timeout=60)
    assert r.returncode == 0 and "checkpoint folder" not in r.stderr, r.stderr
    assert not (Path.home() / ".cache/mltrain/checkpoints" / ml.run_dirs()[-1].name).exists()


def test_dry_run_says_what_would_travel(ml):
    p, remote = project(ml, '[setup]\ncommand = "pip install -r requirements.txt"\nwhen = "always"\n')
    r = ml("run", "--dry-run", p / "job.toml")
    assert r.returncode == 0, r.stderr
    assert f"workdir: {remote}\n" in r.stdout, r.stdout
    assert f"sync:    {p} -> {remote} on every host (3 files" in r.stdout, r.stdout
    assert "pull:    out/ from every host" in r.stdout
    assert "setup:   pip install -r requirements.txt (always)" in r.stdout
    assert not remote.exists() and not ml.run_dirs()


def test_a_file_that_cannot_be_listed_is_named_before_anything_starts(ml):
    p, remote = project(ml)
    os.symlink("x", p / "src" / "loop")  # fine: a link travels as a link
    big = p / "src" / "v.txt"
    r = ml("run", p / "job.toml", "--", "true", timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.readlink(remote / "src" / "loop") == "x"
    big.chmod(0)
    if os.geteuid() != 0:  # root reads anything
        r = ml("run", p / "job.toml", timeout=60)
        assert r.returncode != 0 and "v.txt" in r.stderr and "exclude" in r.stderr, r.stderr


def test_the_sync_summary_shows_file_names_escaped(ml):
    # The laptop's own names, yet a name may hold any byte: one with "\x1b[2J" cleared the screen.
    p, remote = project(ml)
    (p / "src" / "evil\x1b[2J\x07.txt").write_text("x" * 4096)
    r = ml("run", "-v", p / "job.toml", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr
    assert "sync: sent src/evil\\x1b[2J\\x07.txt (4096 B)" in r.stderr, r.stderr
    assert (remote / "src" / "evil\x1b[2J\x07.txt").read_text() == "x" * 4096


def test_a_synced_folder_replaced_by_a_link_is_called_a_link_and_kept(ml):
    p, remote = project(ml)
    assert ml("run", p / "job.toml", timeout=60).returncode == 0
    elsewhere = ml.dir / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(remote / "src")
    (remote / "src").symlink_to(elsewhere)
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode != 0
    # It was called "a file the job wrote".
    assert "src is a folder in your folder, but here it is a link (not followed" in r.stderr, r.stderr
    assert (remote / "src").is_symlink() and list(elsewhere.iterdir()) == []


# --no-sync reuses the folder synced last.
def test_no_sync_runs_in_the_folder_synced_last(ml):
    name = "reuse-" + ml.marker().lower().replace("_", "-")[-8:]
    proj = ml.dir / name
    proj.mkdir()
    (proj / "train.sh").write_text("echo in $(pwd)\n")
    spec = proj / "job.toml"
    spec.write_text(f'name = "{name}"\n[run]\ncommand = "sh train.sh"\n[sync]\n')
    never = ml.dir / (name + "-never")
    never.mkdir()
    try:
        r = ml("run", spec)
        assert r.returncode == 0, r.stderr
        synced = r.stdout.split("in ", 1)[1].strip()
        assert Path(synced).is_dir()
        assert Path(synced) == work_dir(Path.home(), name), r.stdout
        (proj / "train.sh").write_text("echo changed\n")
        r = ml("run", spec, "--no-sync")
        assert r.returncode == 0, r.stderr
        assert "in " + synced in r.stdout, r.stdout  # the synced copy, not the laptop's folder
        r = ml("run", spec, "--no-sync", "--dry-run")
        assert "workdir: ~/.cache/mltrain/work/" + Path(synced).name in r.stdout, r.stdout
        # Another job from the same folder runs in the same synced copy ...
        other = proj / "other.toml"
        other.write_text(f'name = "{name}-other"\n[run]\ncommand = "sh train.sh"\n[sync]\n')
        r = ml("run", other, "--no-sync")
        assert r.returncode == 0 and "in " + synced in r.stdout, r.stdout
        # ... and a project never synced has none to run in.
        fresh = never / "fresh.toml"
        fresh.write_text(f'name = "{name}"\n[run]\ncommand = "true"\n[sync]\n')
        r = ml("run", fresh, "--no-sync")
        assert r.returncode == 127 and "run once without --no-sync" in r.stderr, r.stderr
    finally:
        for n in (name, name + "-never"):
            shutil.rmtree(work_dir(Path.home(), n), ignore_errors=True)
