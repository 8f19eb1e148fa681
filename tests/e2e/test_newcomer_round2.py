"""What a new user hit, round 2 (issue 33), on this machine: exec's one-word shell form, derived job
names, sbatch's slots and its error lines, PYTHONUNBUFFERED, a SIGKILLed launcher's duration,
`ls`'s kind column and help, exec and `latest`, --no-sync reusing the folder synced last."""
import json
import os
import shutil
import signal
import time
from pathlib import Path

from conftest import wait_for, work_dir


# --- 1. exec's one-word shell form -------------------------------------------------------------

def test_exec_runs_one_word_as_a_shell_command_line(ml):
    r = ml("exec", "--", "cd / && pwd && echo two words")
    assert r.returncode == 0, r.stderr
    assert "/" in r.stdout.split() and "two words" in r.stdout, r.stdout
    spec = ml.write("job.toml", '[run]\ncommand = "true"\n')
    r = ml("exec", spec, "--", "cd ~ && pwd")
    assert r.returncode == 0 and "rename the job" not in r.stderr, r.stderr
    assert r.stdout.strip(), r.stdout
    # A plain word is still a program: its absence is the usual 127.
    r = ml("exec", "--", "no-such-program-xyz")
    assert r.returncode == 127, r.stderr


# --- 9. names derived from a command or a file -------------------------------------------------

def test_names_derived_from_a_command_or_a_file_are_made_valid(ml):
    r = ml("run", "--dry-run", "--", "echo hi there")
    assert r.returncode == 0 and "rename the job" not in r.stderr, r.stderr
    assert r.stdout.startswith("run echo:"), r.stdout
    spec = ml.write("my job.toml", '[run]\ncommand = "echo derived-ok"\n')
    r = ml("run", spec)
    assert r.returncode == 0, r.stderr
    assert "derived-ok" in r.stdout
    assert json.loads(ml("show", "--json").stdout)["name"] == "my-job"
    # A name the user chose is still checked.
    bad = ml.write("bad.toml", 'name = "my job"\n[run]\ncommand = "true"\n')
    r = ml("run", bad)
    assert r.returncode == 2 and "rename the job" in r.stderr, r.stderr


# --- 2. sbatch: slots per host, its error's lines ----------------------------------------------

def test_sbatch_keeps_the_hosts_slots_and_refuses_uneven_ones(ml):
    spec = ml.write("slots.toml", '[run]\ncommand = "true"\n[cluster]\nhosts = ["h1:2", "h2:2", "h3:2", "h4:2"]\n')
    r = ml("sbatch", spec, "--print")
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=4" in r.stdout and "#SBATCH --ntasks-per-node=2" in r.stdout, r.stdout
    uneven = ml.write("uneven.toml", '[run]\ncommand = "true"\n[cluster]\nhosts = ["h1:2", "h2:1"]\n')
    r = ml("sbatch", uneven, "--print")
    assert r.returncode == 2 and "h1:2, h2:1" in r.stderr and "procs_per_host" in r.stderr, r.stderr


def test_sbatch_refusal_prints_its_lines_as_lines(ml):
    bindir = ml.dir / "bin"
    bindir.mkdir()
    fake = bindir / "sbatch"
    fake.write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed:'\n"
                    "echo 'Requested node configuration is not available'\nexit 1\n")
    fake.chmod(0o755)
    spec = ml.write("job.toml", '[run]\ncommand = "true"\n')
    r = ml("sbatch", spec, "--nodes", "2", env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    assert r.returncode == 255, r.stderr
    assert "\\x0a" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert any(ln.strip() == "Requested node configuration is not available" for ln in lines), r.stderr


# --- 17. PYTHONUNBUFFERED ----------------------------------------------------------------------

def test_ranks_get_pythonunbuffered_unless_the_user_set_it(ml):
    sh = ["sh", "-c", 'echo "unbuf=${PYTHONUNBUFFERED:-unset}"']
    r = ml("run", "-n", "2", "--", *sh, unset=("PYTHONUNBUFFERED",))
    assert r.returncode == 0 and r.stdout.count("unbuf=1") == 2, r.stdout
    r = ml("run", "-n", "1", "--env", "PYTHONUNBUFFERED=", "--", *sh)
    assert "unbuf=unset" in r.stdout, r.stdout
    # A Python rank's line reaches the console while it still runs.
    p = ml.popen("run", "-n", "1", "--", "python3", "-c",
                 "import time; print('early line'); time.sleep(30)", unset=("PYTHONUNBUFFERED",))
    got = b""
    os.set_blocking(p.stdout.fileno(), False)
    deadline = time.time() + 10
    while time.time() < deadline and b"early line" not in got:
        got += p.stdout.read() or b""
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=20)
    assert b"early line" in got, got


# --- 7. a SIGKILLed launcher's duration; ls --help -----------------------------------------------

def test_a_lost_run_keeps_its_last_known_duration(ml):
    r = ml("run", "-d", "--", "sh", "-c", "echo first; sleep 2; echo second; sleep 60")
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    rec = json.loads(ml("show", "--json", run_id).stdout)
    wait_for(lambda: "second" in ml("logs", run_id).stdout, 20, "the second line")
    os.kill(rec["launcher_pid"], signal.SIGKILL)
    wait_for(lambda: json.loads(ml("show", "--json", run_id).stdout)["status"] == "lost", 20, "lost")
    doc = json.loads(ml("show", "--json", run_id).stdout)
    assert doc["duration_s"] is not None and doc["duration_s"] >= 1.5, doc["duration_s"]
    row = [ln for ln in ml("ls").stdout.splitlines() if ln.startswith(run_id)][0]
    assert "0ms" not in row, row
    assert "at least" in ml("show", run_id).stdout


def test_ls_help_describes_its_json_as_an_object(ml):
    r = ml("ls", "--help")
    assert r.returncode == 0 and "JSON array" not in r.stdout and "object" in r.stdout, r.stdout


# --- 8. exec and latest, the kind column, the exec summary -------------------------------------

def test_exec_is_a_kind_in_ls_and_does_not_take_latest_from_cp(ml):
    spec = ml.write("keep.toml", f'[run]\ncommand = "echo kept > out.txt"\nworkdir = "{ml.dir}"\n')
    r = ml("run", spec)
    assert r.returncode == 0, r.stderr
    run_id = json.loads(ml("show", "--json").stdout)["id"]
    r = ml("exec", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "succeeded on 1 host" in r.stderr and "rank" not in r.stderr.split("succeeded")[0], r.stderr
    lines = ml("ls").stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATUS", "KIND"], lines[0]
    assert lines[1].split()[2] == "exec" and lines[2].split()[2] == "run", lines
    assert json.loads(ml("show", "--json").stdout)["kind"] == "exec"
    dest = ml.dir / "copied.txt"
    r = ml("cp", "latest:out.txt", dest)
    assert r.returncode == 0, r.stderr
    assert dest.read_text() == "kept\n"
    assert "an exec" in r.stderr and run_id in r.stderr, r.stderr


# --- 11. --no-sync reuses the folder synced last ------------------------------------------------

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
