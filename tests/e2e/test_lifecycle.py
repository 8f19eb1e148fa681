"""Launcher signals, lost launchers, preflight, leftovers and odd rank behaviour."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import communicate, pids_with_arg, wait_for, wait_gone


def _ranks_up(tmp_path, n):
    return lambda: all((tmp_path / f"ready.{i}").exists() for i in range(n))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_signal_to_launcher_stops_the_job(ml, tmp_path, sig):
    m = ml.marker()
    p = ml.popen("run", "-n", "2", "--env", f"D={tmp_path}", "--", "sh", "-c",
                 'touch "$D/ready.$RANK"; exec sleep "$0"', m, text=True)
    wait_for(_ranks_up(tmp_path, 2), 10, "ranks to start")
    wait_for(lambda: len(set(pids_with_arg(m)) - {p.pid}) == 2, 5, "ranks to exec sleep")
    p.send_signal(sig)
    out, err = communicate(p, 15)
    assert p.returncode == 128 + sig, err  # 143 for TERM, 129 for HUP
    assert wait_gone(m, 2) == []
    rec = json.loads(ml("show", "--json").stdout)
    assert rec["status"] == "stopped" and rec["exit_code"] == 128 + sig


def test_term_handler_output_is_kept(ml, tmp_path):
    # Ranks stopped by the gang get TERM; what their handlers print still reaches console and log.
    # Rank 0 fails once the others' handlers are set (a rank started late would die by TERM).
    script = ('trap \'echo "cleanup $RANK"; exit 0\' TERM; touch "$D/ready.$RANK"; '
              'if [ "$RANK" = 0 ]; then until [ -e "$D/ready.1" ] && [ -e "$D/ready.2" ]; do sleep 0.05; done; '
              'sleep 0.5; exit 1; fi; while :; do sleep 0.1; done')
    r = ml("run", "-n", "3", "--grace-period", "3s", "--env", f"D={tmp_path}", "--", "sh", "-c", script)
    assert r.returncode == 1
    assert "[1] cleanup 1" in r.stdout and "[2] cleanup 2" in r.stdout, r.stdout
    (d,) = ml.run_dirs()
    assert "cleanup 2" in (d / "rank-2.log").read_text()


def test_detached_launcher_killed(ml):
    m = ml.marker()
    run_id = ml("run", "-d", "-n", "2", "--", "sleep", m, timeout=10).stdout.strip()
    wait_for(lambda: len(pids_with_arg(m)) >= 2, 10, "ranks to start")
    rec = json.loads(ml("show", "--json", run_id).stdout)
    os.kill(rec["launcher_pid"], signal.SIGKILL)
    assert wait_gone(m, 5) == [], "ranks outlived their detached launcher by 5 s"
    # A zombie launcher (its new parent, pid 1 here, reaps it late) still counts as alive for a
    # moment; see the report. Allow for that, then expect "lost".
    wait_for(lambda: "lost" in ml("show", run_id).stdout, 10, "show to say 'lost'", step=0.2)
    assert "running" not in ml("ls").stdout and "lost" in ml("ls").stdout
    f = ml("logs", "-f", run_id, timeout=10)  # must not follow a dead run forever
    assert f.returncode >= 0
    s = ml("stop", run_id, timeout=10)
    assert s.returncode in (0, 1, 2)


def test_detached_launcher_killed_json_status(ml):
    m = ml.marker()
    run_id = ml("run", "-d", "-n", "1", "--", "sleep", m, timeout=10).stdout.strip()
    wait_for(lambda: pids_with_arg(m), 10, "the rank to start")
    os.kill(json.loads(ml("show", "--json", run_id).stdout)["launcher_pid"], signal.SIGKILL)
    assert wait_gone(m, 5) == []
    wait_for(lambda: "lost" in ml("show", run_id).stdout, 10, "show to say 'lost'", step=0.2)
    assert json.loads(ml("ls", "--json").stdout)["runs"][0]["status"] != "running"
    assert json.loads(ml("show", "--json", run_id).stdout)["status"] != "running"


def test_background_child_of_a_rank_does_not_hold_the_run(ml):
    m = ml.marker()
    t0 = time.monotonic()
    r = ml("run", "-n", "2", "--", "sh", "-c", 'sleep "$0" & echo started', m, timeout=20)
    assert r.returncode == 0
    assert time.monotonic() - t0 < 5, "mltrain waited for a rank's background child"
    assert sorted(r.stdout.splitlines()) == ["[0] started", "[1] started"]
    assert wait_gone(m, 2) == [], "a rank's leftover child survived the run"


@pytest.mark.parametrize("args,what", [
    (["--", "/nonexistent/prog"], "/nonexistent/prog"),
    (["--workdir", "/nonexistent/dir", "--", "pwd"], "/nonexistent/dir"),
], ids=["no-program", "no-workdir"])
def test_preflight_failure_starts_nothing(ml, tmp_path, args, what):
    t0 = time.monotonic()
    r = ml("run", "-n", "2", *args)
    assert r.returncode == 127, r  # could not start, as a shell says (docs/exit-codes.md)
    assert time.monotonic() - t0 < 5
    assert "mltrain: error:" in r.stderr and what in r.stderr
    assert "no rank was started" in r.stderr


def test_workdir(ml, tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    r = ml("run", "-n", "2", "--workdir", wd, "--", "pwd")
    assert sorted(r.stdout.splitlines()) == [f"[0] {wd}", f"[1] {wd}"]
    spec = ml.write("sub/job.toml", "[run]\ncommand = 'pwd'\nworkdir = '../wd'\n")
    r = ml("run", spec)  # relative to the spec file
    assert r.stdout.strip() == f"[0] {wd}", r.stderr


def test_rank_exit_code_above_128(ml):
    r = ml("run", "-n", "2", "--", "sh", "-c", '[ "$RANK" = 1 ] && exit 200; sleep 5')
    assert r.returncode == 200
    assert "exit code 200" in r.stderr


def test_env_value_with_equals(ml):
    r = ml("run", "-n", "1", "--env", "K=a=b=c", "--", "printenv", "K")
    assert r.stdout == "[0] a=b=c\n"


def test_many_ranks(ml):
    r = ml("run", "-n", "48", "--", "sh", "-c", "echo $RANK $LOCAL_RANK $WORLD_SIZE", timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == sorted(f"[{i}] {i} {i} 48" for i in range(48))


def test_concurrent_runs_get_distinct_records(ml):
    procs = [ml.popen("run", "-n", "2", "--name", "same", "--", "sh", "-c", f"echo run{i}; sleep 0.3")
             for i in range(4)]
    for p in procs:
        communicate(p, 30)
        assert p.returncode == 0
    runs = json.loads(ml("ls", "--json").stdout)["runs"]
    assert len(runs) == 4 and len({x["id"] for x in runs}) == 4
    outs = sorted(ml("logs", x["id"], "--rank", "0").stdout for x in runs)
    assert outs == [f"[0] run{i}\n" for i in range(4)]


def test_restart_stops_survivors_before_the_next_attempt(ml, tmp_path):
    # Attempt 0: rank 0 fails, rank 1 ignores TERM and must be killed before attempt 1 starts.
    m = ml.marker()
    log = tmp_path / "events"
    # Rank 0 fails once rank 1 ignores TERM (started late, it would die by TERM).
    script = (f'echo "start $RANK $TORCHELASTIC_RESTART_COUNT" >> {log}; '
              'if [ "$TORCHELASTIC_RESTART_COUNT" = 1 ]; then exit 0; fi; '
              f'if [ "$RANK" = 0 ]; then until [ -e {tmp_path}/ignoring ]; do sleep 0.05; done; sleep 0.5; exit 1; fi; '
              f'trap "" TERM; touch {tmp_path}/ignoring; while :; do sleep 0.1; done')
    t0 = time.monotonic()
    r = ml("run", "-n", "2", "--max-restarts", "1", "--grace-period", "1s", "--",
           "sh", "-c", script, m, timeout=30)
    assert r.returncode == 0, r.stderr
    assert 1.4 < time.monotonic() - t0 < 15  # 0.5 s, the 1 s grace; the slack: a busy machine
    assert sorted(log.read_text().splitlines()) == ["start 0 0", "start 0 1", "start 1 0", "start 1 1"]
    assert wait_gone(m, 1) == []


def test_stdin_is_not_the_launchers(ml):
    # A rank reading stdin must not block on (or steal) the launcher's terminal or pipe.
    p = ml.popen("run", "-n", "2", "--", "sh", "-c", 'cat; echo "eof $RANK"', stdin=subprocess.PIPE,
                 text=True)
    out, err = communicate(p, 15)  # communicate closes our end only after reading everything
    assert p.returncode == 0, err
    assert sorted(out.splitlines()) == ["[0] eof 0", "[1] eof 1"]


# A host name that never resolves (RFC 2606): connecting fails at once, no test cluster needed.
NO_HOST = "h9.invalid"


@pytest.mark.parametrize("args,code,what", [
    (["--", "/nonexistent/prog"], 127, "/nonexistent/prog"),
    (["-H", NO_HOST, "--", "true"], 255, NO_HOST),
], ids=["no-program", "no-host"])
def test_detach_fails_when_preflight_fails(ml, args, code, what):
    r = ml("run", "-d", "-n", "1", *args, timeout=40)
    assert r.returncode == code, r
    assert "started in the background" not in r.stderr and r.stdout == "", r
    assert "mltrain: error:" in r.stderr and what in r.stderr, r.stderr
    rec = json.loads(ml("show", "--json").stdout)
    assert rec["exit_code"] == code and rec["status"] != "running", rec
    logs = ml("logs", rec["id"])
    assert "mltrain: error:" in logs.stdout and what in logs.stdout, logs


def test_detach_returns_once_ranks_started(ml, tmp_path):
    m = ml.marker()
    r = ml("run", "-d", "-n", "1", "--env", f"D={tmp_path}", "--", "sh", "-c",
           'touch "$D/up"; exec sleep "$0"', m, timeout=20)
    assert r.returncode == 0, r
    assert "started in the background" in r.stderr
    run_id = r.stdout.strip()
    wait_for(lambda: (tmp_path / "up").exists(), 10, "the rank to start")
    assert ml("stop", run_id).returncode == 0


def test_logs_shows_launcher_error_of_a_failed_run(ml):
    r = ml("run", "-n", "1", "--", "/nonexistent/prog")
    assert r.returncode == 127
    logs = ml("logs")
    assert "mltrain: error: preflight failed" in logs.stdout and "/nonexistent/prog" in logs.stdout, logs


@pytest.mark.parametrize("args,code,status", [
    (["--", "/nonexistent/prog"], 127, "failed"),
    (["-H", NO_HOST, "--", "true"], 255, "host-failure"),
    (["--", "sh", "-c", "exit 3"], 3, "failed"),
], ids=["no-program", "no-host", "rank-fails"])
def test_json_record_on_every_outcome(ml, args, code, status):
    r = ml("run", "--json", "-n", "1", *args, timeout=40)
    assert r.returncode == code, r
    rec = json.loads(r.stdout)  # exactly one JSON document, nothing else on stdout
    assert rec["status"] == status and rec["exit_code"] == code, rec


def test_fixed_master_port_in_use_fails_preflight(ml):
    import socket
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        spec = ml.write("job.toml", f"[run]\ncommand = 'true'\n[cluster]\nnprocs = 2\n[comm]\nmaster_port = {port}\n")
        r = ml("run", spec)
    finally:
        busy.close()
    assert r.returncode == 255, r
    assert f"master_port {port} is already in use" in r.stderr and "no rank was started" in r.stderr, r.stderr
    assert "localhost" in r.stderr or "master_port" in r.stderr


def test_rank_exit_255_is_not_a_lost_host(ml):
    r = ml("run", "-n", "2", "--", "sh", "-c", '[ "$RANK" = 1 ] && exit 255; sleep 5')
    assert r.returncode == 255
    assert "the rank's own exit code; its host was not lost" in r.stderr, r.stderr
    rec = json.loads(ml("show", "--json").stdout)
    assert rec["failure"]["reason"] == "rank_exit" and rec["failure"]["rank"] == 1, rec
    assert not any(k["host_lost"] for k in rec["ranks"]), rec


def test_doctor_checks_torch_with_the_jobs_python(ml, tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    fake = venv / "python3"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "Python 3.99.0" && exit 0\n'
                    'echo 9.9.9-fake\n')
    fake.chmod(0o755)
    r = ml("doctor", "--", "python3", "train.py", env={"PATH": f"{venv}:{os.environ['PATH']}"})
    assert f"checked with {fake}" in r.stdout, r.stdout
    assert "9.9.9-fake" in r.stdout and "3.99.0" in r.stdout, r.stdout
