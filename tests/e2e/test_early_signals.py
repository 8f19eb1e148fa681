"""A signal while mltrain is still connecting to hosts or running preflight ends the run at once
(130 for Ctrl-C, 143 for SIGTERM) and no rank ever starts, on any host.

Locally, a slow agent is a stand-in put where mltrain keeps its agent (the local transport runs
the cached file it finds): one that never answers hello (mltrain is connecting), and a proxy that
passes hello to the real agent but holds the preflight request back (mltrain is in preflight).
Across hosts, see test_multihost.py (a host cut off the network holds its connection open).
"""
import json
import shutil
import signal
import stat
import time

import pytest

from conftest import communicate, wait_for

SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
IDS = ["INT", "TERM", "HUP"]

# Holds back everything after hello: the agent answers hello, never sees prepare.
HOLD_PREPARE = """#!/usr/bin/python3
import os, struct, subprocess, sys
real = os.path.join(os.path.dirname(os.path.abspath(__file__)), "real-agent")
agent = subprocess.Popen([real], stdin=subprocess.PIPE)
inp = sys.stdin.buffer
head = inp.read(12)
agent.stdin.write(head + inp.read(struct.unpack("<I", head[:4])[0]))
agent.stdin.flush()
open(os.environ["HELD"], "w").close()
inp.read()  # until the launcher goes
agent.kill()
"""

# Keeps the channel open (fd 3) and reads until the launcher goes, never answering (it first
# makes the file $CONNECTING: mltrain is connecting then, its signal handlers long set).
NEVER_ANSWER = """#!/bin/sh
exec 3>&1
: > "$CONNECTING"
cat >/dev/null
"""


def _slow_agent(ml, tmp_path, script):
    """Replaces the cached local agent by `script`, keeping the real one beside it."""
    p = ml("run", "-n", "1", "--", "true")
    assert p.returncode == 0, p.stderr
    agents = [f for f in (ml.home / "agent").iterdir() if f.name.startswith("mltrain-agent-")]
    assert len(agents) == 1, agents
    shutil.move(agents[0], agents[0].parent / "real-agent")
    agents[0].write_text(script)
    agents[0].chmod(agents[0].stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)


def _interrupt(p, sig, ready, what):
    wait_for(ready, 30, what)
    time.sleep(0.2)  # mltrain is waiting now, not just starting
    t0 = time.monotonic()
    p.send_signal(sig)
    out, err = communicate(p, 10)
    took = time.monotonic() - t0
    # At once: well within the 30 s a host has to answer (1.0 s was too tight for a busy machine).
    assert took < 5, f"exit {took:.2f}s after the signal"
    return took, out, err


@pytest.mark.parametrize("sig,code", SIGNALS, ids=IDS)
def test_signal_while_connecting_starts_nothing(ml, tmp_path, sig, code):
    _slow_agent(ml, tmp_path, NEVER_ANSWER)
    connecting = tmp_path / "connecting"
    p = ml.popen("run", "-n", "2", "--env", f"D={tmp_path}", "--", "sh", "-c", 'touch "$D/started.$RANK"',
                 env={"CONNECTING": str(connecting)}, text=True)
    _, _, err = _interrupt(p, sig, connecting.exists, "mltrain to connect")
    assert p.returncode == code, err
    assert "no rank was started" in err, err
    assert "passing SIGINT" not in err, err
    assert not list(tmp_path.glob("started.*"))


@pytest.mark.parametrize("sig,code", SIGNALS, ids=IDS)
def test_signal_during_preflight_starts_nothing(ml, tmp_path, sig, code):
    _slow_agent(ml, tmp_path, HOLD_PREPARE)
    held = tmp_path / "held"
    p = ml.popen("run", "-n", "2", "--env", f"D={tmp_path}", "--", "sh", "-c", 'touch "$D/started.$RANK"',
                 env={"HELD": str(held)}, text=True)
    _, _, err = _interrupt(p, sig, held.exists, "the agent to answer hello")
    assert p.returncode == code, err
    assert "during preflight" in err and "no rank was started" in err, err
    assert not list(tmp_path.glob("started.*"))
    rec = json.loads(ml("show", "--json").stdout)
    assert rec["status"] == ("interrupted" if sig == signal.SIGINT else "stopped")
    assert rec["exit_code"] == code


def test_json_record_printed_when_interrupted_while_connecting(ml, tmp_path):
    _slow_agent(ml, tmp_path, NEVER_ANSWER)
    connecting = tmp_path / "connecting"
    p = ml.popen("run", "--json", "-n", "1", "--", "true", env={"CONNECTING": str(connecting)}, text=True)
    _, out, err = _interrupt(p, signal.SIGINT, connecting.exists, "mltrain to connect")
    assert p.returncode == 130, err
    rec = json.loads(out)  # the final record, once
    assert rec["status"] == "interrupted" and rec["exit_code"] == 130
