"""Issue 33, items 15 and 16: `[setup] inputs` decides when the setup runs again, and a sync names
what travelled (the largest few, every one with -v), warns about a big file, and says how it goes
when stderr is not a terminal."""
import re


def project(ml, setup_extra=""):
    p = ml.dir / "proj"
    p.mkdir()
    (p / "job.toml").write_text(
        f'name = "inp"\n[run]\ncommand = "true"\n[sync]\nremote_dir = "{ml.dir / "remote"}"\n'
        f'[setup]\ncommand = "echo set-up >> setup.txt"\n{setup_extra}')
    (p / "requirements.txt").write_text("numpy\n")
    (p / "train.py").write_text("print(1)\n")
    return p


def setups(ml):
    f = ml.dir / "remote" / "setup.txt"
    return f.read_text().count("set-up") if f.exists() else 0


def test_setup_with_inputs_runs_again_only_when_they_change(ml):
    p = project(ml, 'inputs = ["requirements.txt"]\n')
    assert ml("run", p / "job.toml", timeout=60).returncode == 0
    assert setups(ml) == 1
    (p / "train.py").write_text("print(2)\n")  # code, not an input: skipped
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 0 and "setup: skipped" in r.stderr, r.stderr
    assert setups(ml) == 1
    (p / "requirements.txt").write_text("numpy\ntorch\n")
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 0 and "setup: skipped" not in r.stderr, r.stderr
    assert setups(ml) == 2
    dry = ml("run", "--dry-run", p / "job.toml").stdout
    assert "(when it or its inputs (requirements.txt) changed)" in dry, dry


def test_setup_without_inputs_still_runs_again_on_any_change(ml):
    p = project(ml)
    assert ml("run", p / "job.toml", timeout=60).returncode == 0
    (p / "train.py").write_text("print(2)\n")
    assert ml("run", p / "job.toml", timeout=60).returncode == 0
    assert setups(ml) == 2


def test_inputs_that_match_nothing_are_said(ml):
    p = project(ml, 'inputs = ["pyproject.toml"]\n')
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 0
    assert "[setup] inputs (pyproject.toml) match no synced file" in r.stderr, r.stderr


def test_a_sync_names_what_travelled_and_warns_about_a_big_file(ml):
    p = project(ml)
    (p / "data.bin").write_bytes(b"\1" * 12_000_000)
    for i in range(7):
        (p / f"m{i}.py").write_text("x = 1\n" * (i + 1))
    r = ml("run", p / "job.toml", env={"MLTRAIN_SYNC_WARN_BYTES": "2M"}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert re.search(r"sync: data\.bin is 11\.4 MiB and travels to the hosts; leave it out", r.stderr), r.stderr
    line = re.search(r"^mltrain: sync: the largest sent: (.*) \(-v names every one\)$", r.stderr, re.M)
    assert line, r.stderr
    assert line[1].startswith("data.bin (11.4 MiB), job.toml (") and line[1].count("(") == 5, line[1]
    # With -v, every file by name; nothing changed: nothing named.
    (p / "m0.py").write_text("x = 2\n")
    (p / "m1.py").write_text("x = 3\n")
    r = ml("-v", "run", p / "job.toml", timeout=60)
    assert "mltrain: sync: sent m0.py (6 B)" in r.stderr and "mltrain: sync: sent m1.py (6 B)" in r.stderr, r.stderr
    r = ml("run", p / "job.toml", timeout=60)
    assert "nothing changed" in r.stderr and "sync: sent" not in r.stderr and "largest sent" not in r.stderr


def test_a_long_sync_says_how_it_goes_when_stderr_is_not_a_terminal(ml):
    p = project(ml)
    # A slow host: the agent takes its time through the stand-in (each frame to the agent waits).
    (p / "big.bin").write_bytes(b"\2" * 40_000_000)
    import sys
    from pathlib import Path
    slow = Path(__file__).with_name("hostile_agent.py")
    r = ml("run", p / "job.toml", timeout=120,
           env={"MLTRAIN_LOCAL_AGENT_WRAPPER": f"{sys.executable} {slow}", "HOSTILE_PLAY": "slow-sync",
                "HOSTILE_ARG": "40"})
    assert r.returncode == 0, r.stderr
    assert re.search(r"^mltrain: syncing 1 host: \d+/\d+ files, [\d.]+/[\d.]+ MiB", r.stderr, re.M), r.stderr
