"""The escape scenarios shared by test_escapes.py (localhost) and test_multihost_escapes.py (a test
host): a 4-rank job of escapers.py ranks (a double-forked daemon, a re-forker, a 200-process setsid
tree, a subreaper), ended one of six ways, must leave no process carrying its marker."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from conftest import communicate, pids_with_arg, wait_for
from multihost_fixtures import agent_ancestors

ESCAPERS = Path(__file__).resolve().parent / "escapers.py"
ENDINGS = ["normal", "rank-fails", "stop", "ctrl-c", "launcher-sigkill", "agent-sigkill"]


def run_ending(ml, ending: str, ready_dir: Path, run_args=(), popen=None, run=None):
    """Runs the job, ends it as `ending` says and returns (launcher exit code, stderr, marker)
    once the launcher is gone. `popen`/`run` start `mltrain run ARGS` (default: ml's own)."""
    popen = popen or (lambda *a: ml.popen("run", *a, text=True))
    run = run or (lambda *a: ml("run", *a, timeout=60))
    for f in ready_dir.glob("ready-*"):
        f.unlink()
    m = ml.marker()
    try:
        return _run(ml, ending, ready_dir, run_args, popen, run, m)
    except BaseException:
        kill_everything_with(m)
        raise


def _run(ml, ending, ready_dir, run_args, popen, run, m):
    end = {"normal": "normal", "rank-fails": "fail"}.get(ending, "hold")
    args = [*run_args, "-n", "4", "--grace-period", "1s", "--",
            "/usr/bin/python3", str(ESCAPERS), m, end, str(ready_dir)]
    if end != "hold":
        r = run(*args)
        return r.returncode, r.stderr, m
    p = popen(*args)
    try:
        wait_for(lambda: len(list(ready_dir.glob("ready-*"))) == 4, 30, "all 4 ranks ready")
        if ending == "stop":
            run_id = json.loads(ml("show", "--json", "latest").stdout)["id"]
            s = ml("stop", run_id, timeout=30)
            assert s.returncode == 0, s.stderr
        elif ending == "ctrl-c":
            p.send_signal(signal.SIGINT)
        elif ending == "launcher-sigkill":
            p.kill()
        elif ending == "agent-sigkill":
            ranks = [x for x in pids_with_arg(m) if x != p.pid]
            agents = agent_ancestors(ranks)
            assert len(agents) == 1, f"expected one mltrain-agent above the ranks: {agents}"
            os.kill(agents[0], signal.SIGKILL)
        _, err = communicate(p, 60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    return p.returncode, err, m


def kill_everything_with(marker: str):
    """Kills what a failed run left (a re-forker changes pid all the time: by process group,
    round after round, until none is found)."""
    for _ in range(100):
        left = pids_with_arg(marker)
        if not left:
            return
        for pid in left:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


def gone_for_good(marker: str, within_s: float, quiet_s: float = 1.0):
    """Waits until no process carries `marker` for quiet_s on end (a re-forker is missed by a
    scan now and then: its pid changes while /proc is read); returns what is left at within_s."""
    deadline = time.monotonic() + within_s
    quiet_since, seen = None, []
    while True:
        left = pids_with_arg(marker)
        now = time.monotonic()
        if left:
            quiet_since, seen = None, left
        elif quiet_since is None:
            quiet_since = now
        if quiet_since is not None and now - quiet_since >= quiet_s:
            return []
        if now >= deadline:
            return seen  # seen less than quiet_s ago
        time.sleep(0.02)


def check_ending(ml, ending: str, ready_dir: Path, **kw):
    rc, err, m = run_ending(ml, ending, ready_dir, **kw)
    try:
        _check(ending, rc, err, m)
    finally:
        kill_everything_with(m)


def _check(ending, rc, err, m):
    expect = {"normal": 0, "rank-fails": 1, "ctrl-c": 130, "launcher-sigkill": -9,
              "agent-sigkill": 255}
    if ending in expect:
        assert rc == expect[ending], f"{ending}: exit {rc}; stderr {err[-3000:]}"
    if ending == "agent-sigkill":
        assert "the agent died or its connection closed; the ranks there die with it" in err, err
    left = gone_for_good(m, 10)
    assert not left, (f"{ending}: {len(left)} processes of the job alive 10 s after the launcher "
                      f"ended: {[_cmdline(x) for x in left[:5]]}")
