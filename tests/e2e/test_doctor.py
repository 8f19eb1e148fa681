"""`mltrain doctor` on this machine: it checks the interpreter the job runs (a venv's, a named one
on the ranks' PATH, a script's shebang), and names one that is missing with its host, path and a
hint. (On the test cluster: test_multihost_cli.py.)"""
import json
import os

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
