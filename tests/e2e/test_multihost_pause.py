"""A remote job outlives a slow console and a paused launcher (heartbeats never wait on the
console), and a launcher stopped too long is reported as such, not as a rank's SIGTERM.

A one-host cluster of its own. The heartbeat window is 2 s here (MLTRAIN_HEARTBEAT_TIMEOUT, 10 s by
default): each wait that must outlast it is 3 times that or more."""
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import communicate, wait_for
from multihost_fixtures import mh, module_cluster, shared_root  # noqa: F401


cluster = module_cluster(n=1)

# The protocol's timers from their knobs: a host (or the launcher) silent for 2 s is lost.
FAST_HEARTBEATS = {"MLTRAIN_HEARTBEAT_INTERVAL": "500ms", "MLTRAIN_HEARTBEAT_TIMEOUT": "2s"}
PAUSED_S = 6  # 3 windows


def _state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


# 2 ranks x 100,000 lines of 64 bytes: 12.8 MB, past the launcher's console backlog (8 MiB), so the
# ranks are held back while the console is behind.
LINES = 100_000
CHATTY = ("i=0; while [ $i -lt %d ]; do echo \"$RANK line $i ......................................"
          "...........\"; i=$((i+1)); done; echo \"$RANK done\"" % LINES)


@pytest.mark.slow
def test_slow_console_does_not_kill_a_remote_job(mh):
    p = mh.popen("-H", "h1:2", "--workdir", "/tmp", "--", "sh", "-c", CHATTY, env=FAST_HEARTBEATS)
    err = []
    t = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    t.start()
    # Nobody reads the console: `mltrain run ... | (sleep 10; cat)`. The backlog fills within a few
    # seconds; the rest is 3 heartbeat windows and more with the ranks held back.
    time.sleep(10)
    assert p.poll() is None, f"mltrain ended while its console was not read: exit {p.returncode}"
    out = p.stdout.read()
    p.wait(60)
    t.join(10)
    assert p.returncode == 0, err
    for r in (0, 1):
        got = [l for l in out.splitlines() if l.startswith(f"[h1:{r}] {r} line ")]
        assert len(got) == LINES, (r, len(got), err)
        assert f"[h1:{r}] {r} done" in out


def ticker(shared):
    """Ranks that say they are up, then tick until the test creates `go` (two minutes at most)."""
    return (f'touch {shared}/up.$RANK; i=0; while [ ! -e {shared}/go ] && [ $i -lt 600 ]; do '
            f'echo "$RANK tick $i"; i=$((i+1)); sleep 0.2; done; echo "$RANK done"')


def start_ticking(mh, p):
    wait_for(lambda: p.poll() is not None or all((mh.shared / f"up.{r}").exists() for r in (0, 1)), 60,
             "both ranks to start")
    assert p.poll() is None, communicate(p, 10)


@pytest.mark.slow
def test_ctrl_z_pauses_the_launcher_and_fg_resumes_it(mh):
    # A job of its own, as a shell with job control starts it. In an orphaned process group (the
    # test's own may be one under CI) the kernel discards a stop signal's default action, and
    # continues the group's stopped members, with SIGHUP, whenever a process of it exits.
    p = mh.popen("-H", "h1:2", "--workdir", "/tmp", "--", "sh", "-c", ticker(mh.shared), process_group=0,
                 env=FAST_HEARTBEATS)
    start_ticking(mh, p)
    p.send_signal(signal.SIGTSTP)  # what Ctrl-Z sends the foreground job
    deadline = time.monotonic() + 5
    while _state(p.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(p.pid) == "T", "mltrain did not stop on SIGTSTP"
    time.sleep(PAUSED_S)  # longer than the agents' heartbeat timeout
    p.send_signal(signal.SIGCONT)  # fg
    (mh.shared / "go").touch()
    out, err = communicate(p, 60)
    assert p.returncode == 0, err
    assert "paused; the ranks keep running" in err, err
    for r in (0, 1):
        assert f"[h1:{r}] {r} done" in out, out[-2000:]


@pytest.mark.slow
def test_launcher_stopped_too_long_is_named_not_a_rank(mh):
    p = mh.popen("-H", "h1:2", "--workdir", "/tmp", "--", "sh", "-c", ticker(mh.shared), process_group=0,
                 env=FAST_HEARTBEATS)
    start_ticking(mh, p)
    os.kill(p.pid, signal.SIGSTOP)  # cannot be caught: the agents hear nothing
    time.sleep(PAUSED_S)
    os.kill(p.pid, signal.SIGCONT)
    try:
        out, err = communicate(p, 60)
    finally:
        (mh.shared / "go").touch()  # only ranks the agent failed to stop are still there to see it
    assert p.returncode == 255, err
    assert "heard nothing from mltrain for" in err and "stopped its ranks" in err, err
    assert "rank 0 failed" not in err and "SIGTERM" not in err, err
    rec = mh.show()
    assert rec["failure"]["reason"] == "launcher_silent", rec["failure"]
    assert rec["failure"]["rank"] in (-1, None), rec["failure"]


# Ranks that write metric lines to descriptor 3 as fast as they can: the supervisor parses them
# slower than a rank writes, so the SSH link must hold the agent back (flow control), never keep
# taking bytes the launcher cannot use (it grew past 280 MB and crashed in libssh after ~9 s).
METRIC_FLOOD = r'''
import os, sys, time
f = os.fdopen(3, "w", buffering=1 << 16)
t0 = time.monotonic(); i = 0
pad = ", ".join('"k%d": %d.5' % (k, k) for k in range(40))
while time.monotonic() - t0 < float(sys.argv[1]):
    f.write('{"step": %d, "loss": 0.5, %s}\n' % (i, pad)); i += 1
f.close()
print("wrote", i, "lines")
'''


@pytest.mark.slow
def test_a_rank_flooding_metrics_slows_the_rank_not_the_launcher(mh):
    p = mh.popen("-H", "h1:2", "--workdir", "/tmp", "--", "/usr/bin/python3", "-c", METRIC_FLOOD, "15")
    peak_kib = 0
    while p.poll() is None:
        try:
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    peak_kib = max(peak_kib, int(line.split()[1]))
        except OSError:
            break
        time.sleep(0.1)
    out, err = communicate(p, 120)
    assert p.returncode == 0, err[-3000:]
    assert peak_kib < 256 * 1024, f"the launcher's peak RSS was {peak_kib // 1024} MiB"
    # What the record says (run.json) of the lines the ranks wrote.
    run = json.loads((mh.latest_run_dir() / "run.json").read_text())
    wrote = sum(int(l.split()[-2]) for l in out.splitlines() if " wrote " in l)
    metrics = run["metrics"]
    assert "dropped" in metrics
    # Every line a rank wrote is either in the record or counted as dropped.
    assert metrics["records"] + metrics["dropped"] == wrote, (metrics, wrote)
