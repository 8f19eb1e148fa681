"""`mltrain top` (docs/cli.md): a running run's live telemetry or hosts watched directly, one
snapshot (--once, --json) or a full screen driven through tmux; `mltrain show`'s utilization
summary; the status line `mltrain run` keeps under the log stream on a terminal."""
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from multihost_fixtures import python_has_torch

WORKERS = Path(__file__).resolve().parent / "py_workers"
PY = "/usr/bin/python3"
HAS_TORCH, WHY_NOT = python_has_torch(PY)
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason=WHY_NOT)


def detached_straggler(ml, steps=80, delay="0.1"):
    """A detached 4-rank run where rank 1 sleeps `delay` s before each allreduce; its id."""
    r = ml("run", "-d", "-n", "4", "--", PY, WORKERS / "straggler.py", timeout=60,
           env={"STEPS": str(steps), "DELAY": delay, "MLTRAIN_TELEMETRY_INTERVAL": "500ms"})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def wait_ended(ml, run_id, within_s=90):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        rec = json.loads((ml.runs_dir / run_id / "run.json").read_text())
        if rec["status"] != "running":
            return rec
        time.sleep(0.3)
    pytest.fail(f"run {run_id} still running after {within_s}s")


def test_top_and_show_name_the_rank_the_others_wait_for(ml):
    run_id = detached_straggler(ml)
    # No target: the newest running run, read from what its launcher receives. The ranks need a
    # few seconds (python, numpy, init) before their counters say anything.
    deadline = time.monotonic() + 40
    while True:
        r = ml("top", "--once", "--json", timeout=60)
        assert r.returncode == 0, r.stderr
        snap = json.loads(r.stdout)
        if snap["straggler"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert snap["run"] == run_id
    assert [k["rank"] for k in snap["ranks"]] == [0, 1, 2, 3]
    assert snap["straggler"] and snap["straggler"]["rank"] == 1, snap["straggler"]
    shares = {k["rank"]: k["comm_share"] for k in snap["ranks"]}
    assert shares[1] < 0.3 and min(shares[k] for k in (0, 2, 3)) > 0.5, shares
    assert [k["rank"] for k in snap["ranks"] if k["straggler"]] == [1]
    (host,) = snap["hosts"]
    assert host["cpus"] >= 1 and host["cpu_percent"] is not None and host["mem_total_bytes"] > 0
    assert snap["gpus"] == [] and "no GPU" in host["gpu_note"]

    text = ml("top", "--once", run_id[:15], timeout=60)
    assert text.returncode == 0, text.stderr
    assert f"mltrain top - run {run_id} (running) - 1 host, 4 ranks, 0 GPUs" in text.stdout, text.stdout
    assert "straggler: rank 1: the other ranks spend" in text.stdout, text.stdout
    assert "1 " in text.stdout and "<- straggler" in text.stdout

    rec = wait_ended(ml, run_id)
    assert rec["status"] == "succeeded", rec
    show = ml("show", run_id)
    assert show.returncode == 0, show.stderr
    assert "utilization (" in show.stdout and "CPU        |" in show.stdout, show.stdout
    assert "\nstraggler: rank 1: " in show.stdout, show.stdout
    doc = json.loads(ml("show", "--json", run_id).stdout)
    assert doc["id"] == run_id
    u = doc["utilization"]
    assert u["straggler"]["rank"] == 1
    assert [k["rank"] for k in u["ranks"]] == [0, 1, 2, 3]
    assert u["ranks"][1]["comm_share"] < 0.3 < u["ranks"][0]["comm_share"]
    assert u["timeline"]["of"] == "host_cpu_percent" and u["timeline"]["values"]

    # Ended: top says so and points at show.
    ended = ml("top", "--once", run_id)
    assert ended.returncode == 2, ended.stderr
    assert f"run {run_id} is not running (succeeded)" in ended.stderr
    assert f"mltrain show {run_id}" in ended.stderr


@needs_torch
def test_stock_ddp_without_the_hook_gets_a_straggler_estimated_from_cpu_time_and_the_note(ml):
    # Stock DDP over gloo, no mltrain hook: no collective is timed. Rank 1 computes 0.1 s more a
    # step, so ranks 0 and 2 sleep in DDP's allreduce while it works.
    r = ml("run", "-d", "-n", "3", "--", PY, WORKERS / "ddp_straggler.py", timeout=60,
           env={"SECS": "4", "BUSY": "0.1", "MLTRAIN_TELEMETRY_INTERVAL": "250ms"})
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    deadline = time.monotonic() + 60  # torch takes its time to import on a busy machine
    snap, text = None, ""
    while time.monotonic() < deadline:
        t = ml("top", "--once", "--json", run_id, timeout=60)
        if t.returncode != 0:  # ended meanwhile: show has the rest
            break
        snap = json.loads(t.stdout)
        if snap["straggler"] and snap["straggler"]["rank"] == 1:  # once training runs
            text = ml("top", "--once", run_id, timeout=60).stdout
            break
        time.sleep(0.3)
    assert snap and snap["straggler"] and snap["straggler"]["rank"] == 1, snap
    assert snap["collectives_timed"] is False, snap
    assert snap["straggler"]["estimated"] is True
    assert "estimated from CPU time" in snap["straggler"]["why"], snap["straggler"]
    # The screen says plainly that collectives are not timed and how to have them timed.
    assert "collectives not timed: only mltrain's comm library and its DDP hook" in text, text
    assert "(stock DDP: add the hook, docs/python.md)" in text, text
    assert "not timed" in [ln for ln in text.splitlines() if ln.startswith("0 ")][0], text

    rec = wait_ended(ml, run_id)
    assert rec["status"] == "succeeded", rec
    show = ml("show", run_id)
    assert "collectives not timed: only mltrain's comm library" in show.stdout, show.stdout
    assert "\nstraggler: rank 1: estimated from CPU time" in show.stdout, show.stdout
    u = json.loads(ml("show", "--json", run_id).stdout)["utilization"]
    assert u["collectives_timed"] is False
    assert u["straggler"]["rank"] == 1 and u["straggler"]["estimated"] is True, u["straggler"]
    assert [k["rank"] for k in u["ranks"] if k["straggler"]] == [1]


def test_show_without_telemetry_prints_no_utilization(ml):
    r = ml("run", "-n", "1", "--", "true", env={"MLTRAIN_TELEMETRY_INTERVAL": "0"})
    assert r.returncode == 0, r.stderr
    show = ml("show", "latest")
    assert show.returncode == 0 and "utilization" not in show.stdout
    assert json.loads(ml("show", "--json", "latest").stdout)["utilization"] is None


@pytest.mark.alone  # it finds every mltrain rank on the machine: those of tests beside it too
def test_top_watches_this_host_when_no_run_is_running(ml):
    r = ml("top", "--once", "--json", "-i", "300ms", timeout=60)
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    assert snap["run"] is None and snap["ranks"] == [] and snap["problems"] == []
    (h,) = snap["hosts"]
    assert h["host"] == "localhost"
    # Rates need two samples: --once waits for them, so none is missing.
    for k in ("cpu_percent", "mem_total_bytes", "mem_available_bytes", "net_rx_bytes_per_s",
              "net_tx_bytes_per_s"):
        assert h[k] is not None, (k, h)
    # A pipe gets one text snapshot per interval (as `top -b`).
    p = ml.popen("top", "-i", "200ms", text=True)
    time.sleep(2.5)
    p.terminate()
    out, _ = p.communicate(timeout=15)
    assert out.count("mltrain top - this host - 1 host") >= 3, out


def test_top_refuses_what_it_cannot_watch(ml):
    r = ml("top", "--once", "no-such-run")
    assert r.returncode == 2 and "no runs recorded" in r.stderr, r.stderr
    r = ml("top", "--once", "-i", "10ms")
    assert r.returncode == 2 and "--interval 10ms is too short" in r.stderr, r.stderr
    r = ml("top", "--once", "-i", "soon")
    assert r.returncode == 2 and "'soon' is not a duration" in r.stderr, r.stderr
    r = ml("top", "--once", "--hostfile", ml.write("hosts", "nosuchhost.invalid\n"), timeout=90)
    assert r.returncode == 255, (r.stdout, r.stderr)
    assert "nosuchhost.invalid" in r.stderr, r.stderr


# -- a terminal: tmux ---------------------------------------------------------------------------

class Tmux:
    def __init__(self, ml, tmp_path):
        self.sock = f"mlt-{tmp_path.name}"[:40]
        self.env = ml._env()

    def __call__(self, *args, check=True):
        r = subprocess.run(["tmux", "-L", self.sock, "-f", "/dev/null", *args], env=self.env,
                           capture_output=True, text=True, timeout=20)
        if check:
            assert r.returncode == 0, (args, r.stderr)
        return r

    def start(self, command, width=120, height=40):
        self("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), command)
        self("set-option", "-t", "t", "remain-on-exit", "on")

    def screen(self):
        return self("capture-pane", "-p", "-t", "t").stdout

    def wait_for(self, pred, within_s=30):
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            s = self.screen()
            if pred(s):
                return s
            time.sleep(0.2)
        pytest.fail(f"the screen never showed what was expected:\n{self.screen()}")

    def close(self):
        self("kill-server", check=False)


@pytest.fixture
def tmux(ml, tmp_path):
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed (scripts/setup.sh --test-deps installs it)")
    t = Tmux(ml, tmp_path)
    yield t
    t.close()


def test_top_full_screen_keys_resize_and_quit(ml, tmux):
    run_id = detached_straggler(ml, steps=150)
    tmux.start(f"{ml.bin} top -i 300ms; echo TOP-EXIT=$?; sleep 60")
    s = tmux.wait_for(lambda s: "<- straggler" in s and "RANK" in s)
    lines = s.splitlines()
    assert lines[0].startswith(f"mltrain top - run {run_id} (running) - 1 host, 4 ranks"), s
    assert "HOST " in s and "no GPUs" in s
    assert "q quit" in lines[-1] or "q quit" in s, s
    # r: the ranks alone; s: the next sort key, named in the footer.
    tmux("send-keys", "-t", "t", "r")
    s = tmux.wait_for(lambda s: "view: ranks" in s and "HOST             CPU" not in s)
    tmux("send-keys", "-t", "t", "s")
    tmux.wait_for(lambda s: "sort (cpu)" in s)
    tmux("send-keys", "-t", "t", "h")
    tmux.wait_for(lambda s: "view: hosts" in s and "RANK " not in s)
    # A narrower window: every line fits it.
    tmux("resize-window", "-t", "t", "-x", "70", "-y", "20")
    s = tmux.wait_for(lambda s: "view: hosts" in s)
    time.sleep(0.8)
    s = tmux.screen()
    assert all(len(line) <= 70 for line in s.splitlines()), s
    tmux("send-keys", "-t", "t", "q")
    s = tmux.wait_for(lambda s: "TOP-EXIT=" in s)
    assert "TOP-EXIT=0" in s, s
    assert "mltrain top -" not in s  # the alternate screen is gone, the shell's screen is back
    wait_ended(ml, run_id)


def test_run_on_a_terminal_keeps_a_status_line(ml, tmux):
    tmux.start(f"{ml.bin} run -n 2 -- sh -c 'echo started $RANK; sleep 4; echo done $RANK'; echo RUN-EXIT=$?; sleep 60")
    # Elapsed time at once; the host's CPU once its agent sent two samples (about 1 s).
    s = tmux.wait_for(lambda s: "2/2 ranks alive - " in s and " - CPU " in s and "started 1" in s)
    status = [line for line in s.splitlines() if "ranks alive" in line]
    assert len(status) == 1 and status[0].startswith("2/2 ranks alive - "), s
    assert s.rstrip().endswith(status[0].rstrip()), s  # the last line, under the rank output
    s = tmux.wait_for(lambda s: "RUN-EXIT=" in s)
    assert "RUN-EXIT=0" in s and "done 0" in s and "done 1" in s, s
    assert "ranks alive" not in s, s  # taken away before the summary


# top's no-GPU note: once for hosts that share the reason, within the terminal's width.
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
