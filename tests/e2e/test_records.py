"""Detached runs, logs -f, stop, and the run records read by ls / show / logs."""
import json
import os
import re
import signal
import time

import pytest

from conftest import communicate, run_on_pty, wait_for, wait_gone

ID_RE = re.compile(r"^\d{8}-\d{6}-[A-Za-z0-9_.-]+-[0-9a-f]{4}$")


def _record(ml, run_id="latest"):
    r = ml("show", "--json", run_id)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# --- 9. detach, logs -f, stop -------------------------------------------------------------------

def test_detach_prints_id_at_once_and_logs_follow(ml):
    go = ml.dir / "go"
    # The ranks wait for `go`: --detach must return while they run, not when they end.
    r = ml("run", "-d", "-n", "2", "--", "sh", "-c",
           f'echo "tick $RANK 1"; until [ -e {go} ]; do sleep 0.05; done; echo "tick $RANK 2"; echo "tick $RANK 3"',
           timeout=30)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    assert ID_RE.match(run_id), r.stdout
    assert _record(ml, run_id)["status"] == "running", "--detach waited for the job"
    f = ml.popen("logs", "-f", run_id, text=True)
    try:
        time.sleep(1)
        assert f.poll() is None, "logs -f ended while the run went on"
    finally:
        go.touch()
    out, err = communicate(f, 30)  # it followed the run, then ended with it
    assert f.returncode == 0, err
    assert sorted(out.splitlines()) == sorted(f"[{r}] tick {r} {i}" for r in range(2) for i in (1, 2, 3))
    rec = _record(ml, run_id)
    assert rec["status"] == "succeeded" and rec["exit_code"] == 0 and rec["detached"] is True


def test_logs_follow_of_a_finished_run_ends(ml):
    assert ml("run", "-n", "1", "--", "echo", "done").returncode == 0
    f = ml("logs", "-f", timeout=10)
    assert f.returncode == 0 and f.stdout == "[0] done\n"


def test_stop_ends_a_detached_job(ml):
    m = ml.marker()
    r = ml("run", "-d", "-n", "3", "--", "sleep", m, timeout=10)
    run_id = r.stdout.strip()
    wait_for(lambda: len(__import__("conftest").pids_with_arg(m)) >= 3, 10, "ranks to start")
    assert _record(ml, run_id)["status"] == "running"
    s = ml("stop", run_id, timeout=15)
    assert s.returncode == 0, s.stderr
    assert wait_gone(m, 2) == []
    rec = wait_for(lambda: (lambda x: x if x["status"] != "running" else None)(_record(ml, run_id)),
                   5, "the record to be final")
    assert rec["status"] == "stopped", rec["status"]
    assert rec["exit_code"] == 143
    assert ml("show", run_id).stdout.count("stopped") >= 1


def test_stop_kills_term_ignoring_detached_job(ml):
    m = ml.marker()
    r = ml("run", "-d", "-n", "2", "--grace-period", "1s", "--", "sh", "-c",
           'trap "" TERM; while :; do sleep 0.2; done', m, timeout=10)
    run_id = r.stdout.strip()
    wait_for(lambda: len(__import__("conftest").pids_with_arg(m)) >= 3, 10, "ranks to start")
    t0 = time.monotonic()
    s = ml("stop", run_id, timeout=15)
    assert s.returncode == 0, s.stderr
    assert wait_gone(m, 4) == []
    assert time.monotonic() - t0 < 1 + 3
    rec = wait_for(lambda: (lambda x: x if x["status"] != "running" else None)(_record(ml, run_id)),
                   5, "the record to be final")
    assert rec["status"] == "stopped"


def test_stop_latest_by_default(ml):
    m = ml.marker()
    ml("run", "-d", "-n", "1", "--", "sleep", m, timeout=10)
    wait_for(lambda: __import__("conftest").pids_with_arg(m), 10, "the rank to start")
    assert ml("stop", timeout=15).returncode == 0
    assert wait_gone(m, 2) == []


def test_stop_of_a_finished_run(ml):
    ml("run", "-n", "1", "--", "true")
    s = ml("stop")
    # Nothing to stop: either a polite no-op or an error, but never a crash or a hang.
    assert s.returncode in (0, 1, 2), s
    assert "already ended" in s.stderr + s.stdout or "mltrain:" in s.stderr


# --- 10. records ----------------------------------------------------------------------------

def _three_runs(ml):
    ids = []
    for name, script in [("alpha", "exit 0"), ("beta", 'echo "b $RANK"; [ "$RANK" = 1 ] && exit 6; exit 0'),
                         ("gamma", 'for i in 1 2 3 4 5; do echo "loss $RANK.$i"; echo "acc $RANK.$i"; done')]:
        ml("run", "-n", "4", "--name", name, "--grace-period", "1s", "--", "sh", "-c", script)
        ids.append(_record(ml)["id"])
    return ids


def test_ls_and_show(ml):
    ids = _three_runs(ml)
    assert len(set(ids)) == 3
    assert [i.split("-")[2] for i in ids] == ["alpha", "beta", "gamma"]  # "latest" tracked each
    r = ml("ls")
    assert r.returncode == 0
    body = [ln for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("ID")]
    assert [ln.split()[0] for ln in body] == ids[::-1]  # newest first
    assert "failed" in body[1] and body[1].split()[-1] == "6"
    doc = json.loads(ml("ls", "--json").stdout)
    assert doc["schema"] == 1
    runs = doc["runs"]
    assert [x["id"] for x in runs] == ids[::-1]
    assert [x["status"] for x in runs] == ["succeeded", "failed", "succeeded"]
    beta = _record(ml, ids[1])
    assert beta["status"] == "failed" and beta["exit_code"] == 6
    assert [x["rank"] for x in beta["ranks"]] == [0, 1, 2, 3]
    assert beta["ranks"][1]["exit_code"] == 6
    assert beta["failure"]["rank"] == 1 and beta["failure"]["exit_code"] == 6
    assert _record(ml, ids[0])["failure"] is None
    assert all("MLTRAIN_TOKEN" not in x.get("env", {}) for x in beta["ranks"])
    text = ml("show", ids[1]).stdout
    assert ids[1] in text and "failed" in text and "exit 6" in text


def test_show_by_unique_prefix_and_part(ml):
    ids = _three_runs(ml)
    for run_id in ids:
        assert _record(ml, run_id)["id"] == run_id
        assert _record(ml, run_id[:-2])["id"] == run_id or len(
            [i for i in ids if i.startswith(run_id[:-2])]) > 1
    assert _record(ml, "beta")["id"] == ids[1]  # a unique part of the id
    assert _record(ml, ids[2][-4:])["id"] == ids[2]
    assert _record(ml, "latest")["id"] == ids[2]
    r = ml("show", "no-such-run")
    assert r.returncode == 2 and r.stderr.startswith("mltrain: error: no run matches")


def test_logs_latest_with_filters(ml):
    ids = _three_runs(ml)
    r = ml("logs")
    assert r.returncode == 0
    assert len(r.stdout.splitlines()) == 40  # gamma: 4 ranks x 10 lines
    r = ml("logs", "--rank", "0,3")
    assert {ln.split()[0] for ln in r.stdout.splitlines()} == {"[0]", "[3]"}
    r = ml("logs", "--rank", "0,3", "--grep", "^loss")
    assert sorted(r.stdout.splitlines()) == sorted(f"[{k}] loss {k}.{i}" for k in (0, 3) for i in range(1, 6))
    r = ml("logs", "--rank", "2", "--tail", "3")
    assert r.stdout.splitlines() == ["[2] acc 2.4", "[2] loss 2.5", "[2] acc 2.5"]
    r = ml("logs", "--rank", "1-2", "--tail", "1", "--no-prefix")
    assert sorted(r.stdout.splitlines()) == ["acc 1.5", "acc 2.5"]
    r = ml("logs", ids[1], "--rank", "1")
    assert r.stdout.splitlines() == ["[1] b 1"]
    r = ml("logs", "--grep", "([unclosed")
    assert r.returncode == 2 and "--grep" in r.stderr


def test_logs_grep_then_tail(ml):
    _three_runs(ml)
    r = ml("logs", "--rank", "0", "--grep", "loss", "--tail", "2")
    assert r.stdout.splitlines() == ["[0] loss 0.4", "[0] loss 0.5"]


# Each rank waits until the launcher has written the other's line to its rank file, so the order
# the output reached the launcher is fixed by the ranks themselves: 0, 1, 0, 1.
PINGPONG = r"""
d=$(dirname "$TORCHELASTIC_ERROR_FILE")
other=$((1 - RANK))
wait_for() { until grep -qx "$1" "$d/rank-$2.log" 2>/dev/null; do sleep 0.02; done; }
if [ "$RANK" = 0 ]; then
  echo "ping 1"; wait_for "pong 1" 1; echo "ping 2"
else
  wait_for "ping 1" 0; echo "pong 1"; wait_for "ping 2" 0; printf 'pong \033]0;x\007 2\n'
fi
"""


def test_logs_merge_ranks_in_the_order_they_arrived(ml):
    r = ml("run", "-n", "2", "--", "sh", "-c", PINGPONG, timeout=30)
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stdout.splitlines() if "ing" in ln or "ong" in ln][:3] == \
        ["[0] ping 1", "[1] pong 1", "[0] ping 2"]
    merged = ml("logs").stdout.splitlines()
    assert merged == ["[0] ping 1", "[1] pong 1", "[0] ping 2", "[1] pong \x1b]0;x\x07 2"]  # raw into a pipe
    assert ml("logs", "--by-rank").stdout.splitlines() == merged[0::2] + merged[1::2]
    assert ml("logs", "--tail", "1").stdout.splitlines() == merged[2:]  # the last line of each rank
    assert ml("logs", "--grep", "2$", "--no-prefix").stdout.splitlines() == ["ping 2", "pong \x1b]0;x\x07 2"]
    assert ml("logs", "-f").stdout.splitlines() == merged
    # On a terminal: escaped control bytes (no raw OSC to retitle it), colour prefixes.
    rc, out = run_on_pty(ml, ["--color", "never", "logs"])
    assert rc == 0 and out.splitlines()[-1] == rb"[1] pong \x1b]0;x\x07 2", out


def test_logs_prefix_is_the_consoles(ml):
    spec = ml.write("job.toml", '[run]\ncommand = "echo hi"\n[cluster]\nnprocs = 2\n'
                                '[logs]\nprefix = "<{node}.{local_rank}/{rank}>"\n')
    r = ml("run", spec)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()[:2]) == ["<0.0/0> hi", "<0.1/1> hi"]
    assert sorted(ml("logs").stdout.splitlines()) == ["<0.0/0> hi", "<0.1/1> hi"]
    assert json.loads(ml("show", "--json").stdout)["log_prefix"] == "<{node}.{local_rank}/{rank}>"


def test_logs_follow_exits_with_the_runs_code(ml):
    run_id = ml("run", "-d", "-n", "2", "--", "sh", "-c", 'sleep 0.3; exit $((RANK + 3))',
                timeout=10).stdout.strip()
    f = ml("logs", "-f", run_id, timeout=30)
    assert f.returncode == _record(ml, run_id)["exit_code"] in (3, 4), f.stderr
    assert ml("logs", run_id).returncode == 0


def test_rank_logs_hold_every_line(ml):
    ml("run", "-n", "2", "--", "sh", "-c", 'echo "out $RANK"; echo "err $RANK" >&2')
    (d,) = ml.run_dirs()
    for i in range(2):
        assert sorted((d / f"rank-{i}.log").read_text().splitlines()) == [f"err {i}", f"out {i}"]
    assert json.loads((d / "run.json").read_text())["id"] == d.name


def test_run_json_summary(ml):
    r = ml("run", "--json", "-n", "2", "--", "sh", "-c", '[ "$RANK" = 1 ] && exit 9; echo hi')
    assert r.returncode == 9
    # The summary is the JSON document that ends stdout (rank lines may precede it).
    start = r.stdout.index("\n{") + 1 if not r.stdout.startswith("{") else 0
    summary = json.loads(r.stdout[start:])
    assert summary["exit_code"] == 9 and summary["status"] == "failed"
    assert summary["failure"]["rank"] == 1
    assert summary["id"] == _record(ml)["id"]


def test_run_json_stdout_is_only_json(ml):
    r = ml("run", "--json", "-n", "1", "--", "echo", "hi")
    json.loads(r.stdout)


def test_latest_is_the_newest_even_within_one_second(ml):
    # Names that sort backwards, so id order contradicts start order: "latest" and ls must
    # follow start time, not the ids.
    ids = []
    for i in range(6):
        r = ml("run", "--json", "-n", "1", "--name", f"quick{9 - i}", "--", "true")
        ids.append(json.loads(r.stdout[r.stdout.index("{"):])["id"])
        assert _record(ml)["id"] == ids[-1], (i, ids)
    assert [x["id"] for x in json.loads(ml("ls", "--json").stdout)["runs"]] == ids[::-1]


def test_ls_empty_home(ml):
    r = ml("ls")
    assert r.returncode == 0
    assert json.loads(ml("ls", "--json").stdout) == {"schema": 1, "runs": []}
    r = ml("logs")
    assert r.returncode != 0 and r.returncode > 0 and "mltrain: error:" in r.stderr


def test_stop_an_attached_run_from_elsewhere(ml):
    m = ml.marker()
    p = ml.popen("run", "-n", "2", "--", "sleep", m, text=True)
    wait_for(lambda: len(set(__import__("conftest").pids_with_arg(m)) - {p.pid}) == 2, 10, "ranks")
    s = ml("stop", timeout=15)
    assert s.returncode == 0, s.stderr
    out, err = communicate(p, 15)
    assert p.returncode == 143, err
    assert wait_gone(m, 2) == []
    assert _record(ml)["status"] == "stopped"


def test_timeout_is_not_restarted(ml):
    t0 = time.monotonic()
    r = ml("run", "-n", "2", "--max-restarts", "3", "--timeout", "1s", "--", "sleep", "30")
    assert r.returncode == 124
    assert time.monotonic() - t0 < 4
    rec = _record(ml)
    assert rec["restarts"] == 0 and rec["exit_code"] == 124


def test_corrupt_record_does_not_break_the_others(ml):
    ml("run", "-n", "1", "--name", "good", "--", "echo", "x")
    bad = ml.runs_dir / "20000101-000000-bad-0000"
    bad.mkdir()
    (bad / "run.json").write_text("{not json")
    r = ml("ls")
    assert r.returncode == 0 and "good" in r.stdout
    assert [x["name"] for x in json.loads(ml("ls", "--json").stdout)["runs"]] == ["good"]
    assert _record(ml)["name"] == "good"
    r = ml("show", "bad-0000")
    assert r.returncode == 2 and r.returncode >= 0 and "mltrain: error:" in r.stderr
    r = ml("logs", "--rank", "7")
    assert r.returncode == 2 and "no rank 7" in r.stderr


def test_record_without_id_is_not_listed_blank(ml):
    ml("run", "-n", "1", "--", "true")
    odd = ml.runs_dir / "20000101-000000-odd-0000"
    odd.mkdir()
    (odd / "run.json").write_text("{}")
    ids = [x["id"] for x in json.loads(ml("ls", "--json").stdout)["runs"]]
    assert "" not in ids


def test_logs_follow_through_restarts(ml):
    r = ml("run", "-d", "-n", "2", "--max-restarts", "2", "--", "sh", "-c",
           'echo "try $TORCHELASTIC_RESTART_COUNT"; sleep 0.5; [ "$TORCHELASTIC_RESTART_COUNT" = 2 ]',
           timeout=10)
    run_id = r.stdout.strip()
    f = ml("logs", "-f", run_id, timeout=30)
    assert f.returncode == 0, f.stderr
    for k in range(2):
        mine = [ln for ln in f.stdout.splitlines() if ln.startswith(f"[{k}] ")]
        assert [ln for ln in mine if "try" in ln] == [f"[{k}] try {i}" for i in range(3)]
        assert sum("restart" in ln for ln in mine) == 2
    assert _record(ml, run_id)["status"] == "succeeded"


# A SIGKILLed launcher's duration; ls --help.
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
