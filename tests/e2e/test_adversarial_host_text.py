"""Text from a host never reaches the terminal raw (issue 31, item 12): a GPU name with escape codes
(the fake NVML on localhost), a [setup] command's output, a pulled file's name in a problem, an
agent's word in an error; `doctor --json` stays valid, and `show` escapes what the record holds.
The local agent runs the same code as a remote one, so localhost plays the host."""
import json

import pytest

import gpu_fakes

# What a hostile host would send: set the terminal's title, clear the screen, ring the bell.
EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[H"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[H"
CLEAN = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def no_escapes(text: str):
    """No byte a terminal acts on, but newline (and tab)."""
    bad = [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or ord(c) == 0x7f or 0x80 <= ord(c) <= 0x9f]
    assert not bad, repr(text[-2000:])


def test_doctor_escapes_a_gpu_name_and_keeps_json_valid(ml, tmp_path):
    fakes = gpu_fakes.install(tmp_path / "fakes", f"* gpus 2\n* name H100{EVIL}\n")
    spec = ml.write("job.toml", f"""
[run]
command = "true"
[run.env]
MLTRAIN_NVML_LIBRARY = "{fakes / 'libnvidia-ml.so.1'}"
""")
    d = ml("doctor", spec, timeout=60, unset=CLEAN)
    assert d.returncode == 0, d.stderr
    no_escapes(d.stdout + d.stderr)
    assert f"GPU 0: H100{SHOWN}," in d.stdout, d.stdout
    j = ml("doctor", "--json", spec, timeout=60, unset=CLEAN)
    assert j.returncode == 0, j.stderr
    gpus = json.loads(j.stdout)["hosts"][0]["gpus"]
    assert gpus[0]["name"] == f"H100{SHOWN}"


def test_setup_output_is_escaped(ml):
    p = ml.dir / "proj"
    p.mkdir()
    (p / "job.toml").write_text(
        f'name = "s"\n[run]\ncommand = "true"\n[sync]\nremote_dir = "{ml.dir / "remote"}"\n'
        "[setup]\ncommand = \"printf 'before\\\\033]0;pwned\\\\007\\\\033[2Jafter\\\\n'\"\nwhen = \"always\"\n")
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "[localhost] before\\x1b]0;pwned\\x07\\x1b[2Jafter" in r.stderr, r.stderr
    no_escapes(r.stderr)


def test_a_failed_setup_quotes_its_output_escaped_and_show_too(ml):
    p = ml.dir / "proj"
    p.mkdir()
    (p / "job.toml").write_text(
        f'name = "s"\n[run]\ncommand = "true"\n[sync]\nremote_dir = "{ml.dir / "remote"}"\n'
        "[setup]\ncommand = \"printf 'x\\\\033]0;pwned\\\\007\\\\000y\\\\n'; exit 3\"\nwhen = \"always\"\n")
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 255, r.stderr
    no_escapes(r.stderr)
    assert "x\\x1b]0;pwned\\x07\\x00y" in r.stderr, r.stderr  # a NUL does not end the text
    s = ml("show", "latest")
    assert s.returncode == 0, s.stderr
    no_escapes(s.stdout)
    assert "\\x1b]0;pwned" in s.stdout, s.stdout


@pytest.mark.parametrize("past", ["file", "folder"])
def test_a_pulled_name_in_a_problem_is_escaped(ml, past):
    # A matching file the agent cannot read (its path is past PATH_MAX: even root cannot open it),
    # named with escape codes: the problem says it could not be read, escaped; not "nothing matched".
    # "folder": the folder that holds it is past PATH_MAX already (it was skipped without a word).
    # "file": folders to exactly 3950 bytes of path, the file's name past 4096; "folder": over 4300.
    limit = 3700 if past == "file" else 4300
    p = ml.dir / "proj"
    p.mkdir()
    (p / "make.py").write_text(
        "import os\n"
        "fd = os.open('.', os.O_RDONLY)\n"
        "depth = len(os.getcwd())\n"
        "name = 'e\\x1b]0;pwned\\x07' + 'd' * 190\n"
        f"while depth < {limit}:\n"
        "    os.mkdir(name, dir_fd=fd)\n"
        "    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)\n"
        "    depth += len(name) + 1\n"
        "    name = 'd' * 200\n"
        f"if {past == 'file'}:\n"
        "    name = 'd' * (3950 - depth - 1)\n"
        "    os.mkdir(name, dir_fd=fd)\n"
        "    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)\n"
        "name = 'f' * 200 + '.pt'\n"
        "os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))\n")
    (p / "job.toml").write_text(
        f'name = "p"\n[run]\ncommand = "/usr/bin/python3 make.py"\n'
        f'[sync]\nremote_dir = "{ml.dir / "remote"}"\npull = ["*.pt"]\n')
    r = ml("run", p / "job.toml", timeout=60)
    no_escapes(r.stderr)
    # The problem is bounded (4 KiB of a host's text): its start names the path, escaped.
    assert "mltrain: pull: localhost: cannot read " in r.stderr, r.stderr[-3000:]
    assert "/remote/e\\x1b]0;pwned\\x07dddd" in r.stderr, r.stderr[-3000:]
    assert "nothing matched" not in r.stderr, r.stderr[-3000:]
