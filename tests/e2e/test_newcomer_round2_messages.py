"""What a new user hit, round 2 (issue 33), items 13 and 14, on this machine: doctor checks the
interpreter the job runs; the timeout message and the status line name the ranks; bench says its
algorithm in words, ends with nccl-tests' average line and takes --env/-x; top's no-GPU note once."""
import json
import os
import re
import time

from conftest import run_on_pty
from test_top import tmux  # noqa: F401  (the fixture: a terminal through tmux)

FAKE_PYTHON = ('#!/bin/sh\n[ "$1" = --version ] && echo "Python 3.99.0" && exit 0\n'
               'echo 9.9.9-venv\n')


def fake_venv(root):
    """A venv-like folder whose bin/python answers doctor's two questions: a version and torch's."""
    bindir = root / ".venv" / "bin"
    bindir.mkdir(parents=True)
    py = bindir / "python"
    py.write_text(FAKE_PYTHON)
    py.chmod(0o755)
    return py


# --- 13. doctor checks the interpreter the job runs --------------------------------------------

def test_doctor_checks_the_venv_python_the_spec_runs(ml):
    proj = ml.dir / "proj"
    py = fake_venv(proj)
    for run in ('command = ".venv/bin/python train.py --epochs 3"',
                'argv = [".venv/bin/python", "train.py"]',
                "command = \"OMP_NUM_THREADS=2 exec '.venv/bin/python' -u train.py\""):
        spec = ml.write("proj/job.toml", f'[run]\n{run}\nworkdir = "."\n')
        r = ml("doctor", spec, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"checked with {py} (the job's program)" in r.stdout, (run, r.stdout)
        assert "3.99.0" in r.stdout and "9.9.9-venv" in r.stdout, r.stdout
    # With hosts given on the command line, each host checks it; what holds for several hosts is
    # said once for them all (issue 47 item 16: doctor printed 20 identical lines for 20 hosts).
    r = ml("doctor", "-H", "localhost,127.0.0.2", spec, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"\nlocalhost, 127.0.0.2: python and torch checked with {py}" in r.stdout, r.stdout
    assert r.stdout.count("python and torch checked with") == 1, r.stdout
    assert r.stdout.count("no GPU (") == 1, r.stdout


def test_doctor_finds_a_named_python_in_the_ranks_path_and_follows_a_scripts_shebang(ml):
    bindir = ml.dir / "tools"
    bindir.mkdir()
    named = bindir / "python3.77"
    named.write_text(FAKE_PYTHON.replace("9.9.9-venv", "7.7.7-named"))
    named.chmod(0o755)
    spec = ml.write("job.toml", '[run]\ncommand = "python3.77 train.py"\n')
    r = ml("doctor", spec, timeout=60, env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"checked with {named} (the job's program)" in r.stdout and "7.7.7-named" in r.stdout, r.stdout
    # A launcher script (torchrun, accelerate) runs the python its #! line names.
    py = fake_venv(ml.dir)
    launcher = ml.dir / "my-torchrun"
    launcher.write_text(f"#!{py}\nimport sys\n")
    launcher.chmod(0o755)
    spec = ml.write("tr.toml", '[run]\ncommand = "./my-torchrun --nproc-per-node 2 train.py"\n')
    r = ml("doctor", spec, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"checked with {py} (the #! line of " in r.stdout and "9.9.9-venv" in r.stdout, r.stdout


def test_doctor_names_a_missing_interpreter_with_host_path_and_hint(ml):
    proj = ml.dir / "proj"
    proj.mkdir()
    spec = ml.write("proj/job.toml", '[run]\ncommand = ".venv/bin/python train.py"\nworkdir = "."\n')
    r = ml("doctor", spec, timeout=60)
    assert r.returncode == 255, r.stdout + r.stderr
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("localhost "))
    assert " FAIL " in row, r.stdout
    want = f"python: the job's interpreter .venv/bin/python: {proj}/.venv/bin/python does not exist; hint: "
    assert want in row and "python3 -m venv .venv" in row, row
    d = json.loads(ml("doctor", "--json", spec, timeout=60).stdout)["hosts"][0]
    assert not d["ok"] and d["stage"] == "python", d
    assert d["facts"]["python_missing"] == f".venv/bin/python: {proj}/.venv/bin/python does not exist", d
    # A bare name not in the ranks' PATH says so.
    spec = ml.write("named.toml", '[run]\nargv = ["python3.77", "train.py"]\n')
    r = ml("doctor", spec, timeout=60)
    assert r.returncode == 255, r.stdout + r.stderr
    assert "the job's interpreter python3.77: not found in PATH (" in r.stdout, r.stdout
    assert "set PATH in [run] env" in r.stdout, r.stdout
    # A job that runs no python fails nothing over python.
    spec = ml.write("sh.toml", '[run]\ncommand = "echo hi"\n')
    r = ml("doctor", spec, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(python3 in the ranks' PATH (the job's program is not a python))" in r.stdout, r.stdout


# --- 14a. the timeout names the ranks still running --------------------------------------------

def test_timeout_names_the_ranks_still_running_and_their_hosts(ml):
    r = ml("run", "-n", "5", "--timeout", "1s", "--", "sleep", "30", timeout=60)
    assert r.returncode == 124, r.stderr
    assert "timeout of 1.0s; all 5 ranks (on localhost) still running: stopping them" in r.stderr, r.stderr
    r = ml("run", "-H", "localhost:2,127.0.0.2:2", "--timeout", "2s", "--",
           "sh", "-c", '[ "$RANK" = 1 ] && exit 0; sleep 30', timeout=60)
    assert r.returncode == 124, r.stderr
    assert ("the job ran past its timeout of 2.0s; ranks 0,2,3 (on localhost, 127.0.0.2) still running: "
            "stopping them") in r.stderr, r.stderr


# --- 14b. the status line says which ranks are alive -------------------------------------------

def test_status_line_names_the_ranks_alive(ml):
    cmd = 'case $RANK in 2|5) sleep 6;; *) sleep 0.2;; esac'
    rc, out = run_on_pty(ml, ["run", "-n", "8", "--", "sh", "-c", cmd], env={"TERM": "xterm"}, timeout=30)
    assert rc == 0, out[-2000:]
    text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", out).decode(errors="replace")
    assert "2/8 ranks alive (2,5) - " in text, text[-3000:]


# --- 14c. bench: its algorithm in words, nccl-tests' closing lines -----------------------------

def bench_rows(stdout):
    return [ln.split() for ln in stdout.splitlines() if ln.strip() and not ln.startswith("#")]


def test_bench_says_its_algorithm_in_words_and_ends_with_the_average_bus_bandwidth(ml):
    r = ml("bench", "-n", "4", "-b", "64K", "-e", "256K", "--check", timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "large allreduce: direct" not in r.stdout, r.stdout
    assert ("# allreduce of messages over 64K: each rank combines one slice of all the inputs, in one "
            "shared-memory segment (all ranks on one host)") in lines, r.stdout
    rows = bench_rows(r.stdout)
    assert [int(row[0]) for row in rows] == [65536, 131072, 262144], r.stdout
    cols = next(ln for ln in lines if ln.startswith("#") and "#wrong" in ln).lstrip("#").split()
    busbw = [float(row[cols.index("busbw")]) for row in rows]
    # The closing lines as nccl-tests prints them, the average over the sizes.
    assert lines[-3:-1] == ["# Out of bounds values : 0 OK", lines[-2]] and lines[-1] == "#", r.stdout
    m = re.fullmatch(r"# Avg bus bandwidth    : (\d+\.\d{3})", lines[-2])
    assert m, lines[-2]
    assert abs(float(m.group(1)) - sum(busbw) / len(busbw)) < 0.002, (m.group(1), busbw)
    # Why another algorithm: said too.
    r = ml("bench", "-n", "3", "-b", "64K", "-e", "64K", env={"MLTRAIN_COMM_ALGO": "hd"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ("one ring, each rank passing a slice to the next (MLTRAIN_COMM_ALGO=hd does not apply: it needs "
            "a power-of-two number of ranks)") in r.stdout, r.stdout
    assert "# Out of bounds" not in r.stdout and "# Avg bus bandwidth    : " in r.stdout, r.stdout


# --- 14d. bench takes --env and -x as run does -------------------------------------------------

def test_bench_takes_env_and_x_for_its_ranks(ml):
    r = ml("bench", "-n", "2", "-b", "64K", "-e", "64K", "--env", "MLTRAIN_COMM_ALGO=ring",
           "-x", "BENCH_FWD", "-x", "BENCH_SET=2", env={"BENCH_FWD": "fwd-1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(MLTRAIN_COMM_ALGO=ring)" in r.stdout, r.stdout  # the ranks had it
    assert [int(row[0]) for row in bench_rows(r.stdout)] == [65536], r.stdout  # -e is still --maxbytes
    env = json.loads(ml("show", "--json").stdout)["ranks"][1]["env"]
    assert env["BENCH_FWD"] == "fwd-1" and env["BENCH_SET"] == "2" and env["MLTRAIN_COMM_ALGO"] == "ring", env
    r = ml("bench", "-n", "2", "-x", "BENCH_UNSET_XYZ", unset=("BENCH_UNSET_XYZ",), timeout=60)
    assert r.returncode == 2 and "BENCH_UNSET_XYZ is not set in this environment" in r.stderr, r.stderr
    r = ml("bench", "-n", "2", "--env", "NOEQUALS", timeout=60)
    assert r.returncode == 2 and "--env 'NOEQUALS' is not K=V" in r.stderr, r.stderr
    assert "--env" in ml("bench", "--help").stdout


# --- 14e. top: the no-GPU note once, within the terminal's width ------------------------------

HOSTS3 = "localhost,127.0.0.2,127.0.0.3"


def install_agent(ml):
    """The local agent in place before three local hosts start it at once."""
    assert ml("top", "-H", "localhost", "--once", timeout=60).returncode == 0


def test_top_says_no_gpus_once_for_hosts_that_share_the_reason(ml):
    install_agent(ml)
    r = ml("top", "-H", HOSTS3, "--once", timeout=60)
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stdout.splitlines() if ln.startswith("no GPUs")]
    assert len(notes) == 1, r.stdout
    assert notes[0].startswith("no GPUs (localhost, 127.0.0.2, 127.0.0.3: "), notes
    assert notes[0].count("no GPU telemetry") <= 1 and notes[0].endswith(")"), notes


def test_top_full_screen_wraps_the_note_within_the_width(ml, tmux):
    install_agent(ml)
    tmux.start(f"{ml.bin} top -i 300ms -H {HOSTS3}; sleep 60", width=72)
    s = tmux.wait_for(lambda s: "no GPUs" in s and "HOST " in s)
    time.sleep(0.8)
    s = tmux.screen()
    assert s.count("no GPUs") == 1, s
    assert all(len(line) <= 72 for line in s.splitlines()), s
    start = s.index("no GPUs")
    note = s[start:s.index("\n\n", start) if "\n\n" in s[start:] else len(s)]
    assert ")" in note and "\u2026" not in note, note  # whole, its end on a continuation line
    tmux("send-keys", "-t", "t", "q")
