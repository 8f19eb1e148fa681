"""Run-id prefixes (one rule), rm/gc of old records, and the JSON schema (issue 9: 13, 15, 19)."""
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import pids_with_arg, wait_for


def _runs(ml, names):
    ids = []
    for n in names:
        r = ml("run", "--json", "-n", "1", "--name", n, "--", "true")
        assert r.returncode == 0, r.stderr
        ids.append(json.loads(r.stdout[r.stdout.index("{"):])["id"])
    return ids


@pytest.mark.parametrize("cmd", [["show"], ["logs"], ["stop"], ["rm"]])
def test_ambiguous_prefix_is_refused_by_every_command(ml, cmd):
    ids = _runs(ml, ["same", "same"])
    prefix = ids[0][:8]  # the date: both runs
    r = ml(*cmd, prefix)
    assert r.returncode == 2, (cmd, r.stdout, r.stderr)
    assert "matches 2 runs" in r.stderr
    assert r.stderr.index(ids[1]) < r.stderr.index(ids[0])  # newest first
    assert len(ml.run_dirs()) == 2
    # An exact id wins; a unique prefix is accepted.
    assert ml("show", ids[0]).returncode == 0
    assert json.loads(ml("show", "--json", ids[1][:-1]).stdout)["id"] == ids[1]


def test_rm_removes_named_runs_and_says_what_was_freed(ml):
    ids = _runs(ml, ["a", "b", "c"])
    r = ml("rm", ids[0], ids[2])
    assert r.returncode == 0, r.stderr
    assert f"removed {ids[0]}" in r.stdout and f"removed {ids[2]}" in r.stdout
    assert "removed 2 runs" in r.stdout and "freed" in r.stdout
    assert [d.name for d in ml.run_dirs()] == [ids[1]]
    r = ml("rm", "no-such-run")
    assert r.returncode == 2 and "no run matches" in r.stderr


def test_rm_and_gc_never_remove_a_running_run(ml):
    m = ml.marker()
    old = _runs(ml, ["old"])[0]
    r = ml("run", "-d", "-n", "1", "--", "sleep", m, timeout=10)
    live = r.stdout.strip()
    wait_for(lambda: pids_with_arg(m), 10, "the rank to start")
    r = ml("rm", live, old)
    assert r.returncode == 2 and "is running" in r.stderr and f"mltrain stop {live}" in r.stderr
    assert len(ml.run_dirs()) == 2  # nothing removed when one id is refused
    r = ml("gc", "--keep", "0")
    assert r.returncode == 0, r.stderr
    assert [d.name for d in ml.run_dirs()] == [live]
    assert f"removed {old}" in r.stdout and "removed 1 run," in r.stdout
    ml("stop", live, timeout=15)


def test_gc_keep_older_than_and_dry_run(ml):
    ids = _runs(ml, ["r1", "r2", "r3", "r4"])
    r = ml("gc")
    assert r.returncode == 2 and "--older-than" in r.stderr
    r = ml("gc", "--older-than", "1h")
    assert r.returncode == 0 and "removed 0 runs" in r.stdout and len(ml.run_dirs()) == 4
    r = ml("gc", "--keep", "1", "--dry-run")
    assert r.returncode == 0 and r.stdout.count("would remove 20") == 3 and len(ml.run_dirs()) == 4
    time.sleep(1.1)
    r = ml("gc", "--keep", "2", "--older-than", "1s")
    assert r.returncode == 0, r.stderr
    assert sorted(d.name for d in ml.run_dirs()) == sorted(ids[2:])
    assert ml("ls").stdout.splitlines()[1].split()[0] == ids[3]  # ls: newest first


def _half_made(ml, source, id, **changes):
    """A run folder as a launcher killed between making and naming it leaves it: `.ID.new` holding
    the run's first run.json (here a real run's, with `changes`)."""
    rec = json.loads((ml.runs_dir / source / "run.json").read_text())
    rec.update(id=id, status="running", **changes)
    d = ml.runs_dir / f".{id}.new"
    d.mkdir(mode=0o700)
    (d / "run.json").write_text(json.dumps(rec))
    return d


def test_gc_removes_the_folders_killed_launchers_left_half_made_and_only_those(ml):
    (source,) = _runs(ml, ["src"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = _half_made(ml, source, "20261206-000000-dead-0001", launcher_pid=gone.pid)
    (dead / ".run.json.tmp.4242.0.0badf00d").write_text("{")  # a record's write cut short
    stat = Path("/proc/self/stat").read_text()
    start = int(stat[stat.rindex(")") + 2:].split()[19])
    live = _half_made(ml, source, "20261206-000000-live-0002", launcher_pid=os.getpid(), launcher_start=start)
    other = _half_made(ml, source, "20261206-000000-other-0003", launcher_pid=gone.pid)
    (other / "notes.txt").write_text("not mltrain's\n")
    r = ml("gc", "--keep", "10", "--dry-run")
    assert r.returncode == 0 and f"would remove {dead.name} (a run folder its launcher, killed, left half made)" \
        in r.stdout, r.stdout
    assert dead.exists()
    r = ml("gc", "--keep", "10")
    assert r.returncode == 0, r.stderr
    assert f"removed {dead.name}" in r.stdout and not dead.exists()
    assert live.exists() and live.name not in r.stdout  # its launcher is about to rename it
    assert (other / "notes.txt").exists() and other.name not in r.stdout  # holds what mltrain did not write
    assert [d.name for d in ml.run_dirs()] == [source]


# --- 15. one JSON schema ---------------------------------------------------------------------------

RUN_FIELDS = {"schema", "id", "name", "status", "exit_code", "launcher_pid", "launcher_start", "started_at",
              "ended_at", "duration_s", "spec_file", "workdir", "git_commit", "argv", "master_addr",
              "master_port", "restarts", "max_restarts", "generations", "detached", "queued_s", "slurm_job_id", "ps_servers", "log_prefix",
              "kind", "ssh_config", "rerun_of", "sweep",
              "hosts", "ranks", "failure", "pull", "code", "metrics", "spec_text"}
RANK_FIELDS = {"rank", "host", "node_rank", "local_rank", "pid", "exit_code", "signal", "host_lost", "env", "gpus"}


def _check_run(doc, ended=True, fields=RUN_FIELDS):
    assert set(doc) == fields, set(doc) ^ fields
    assert doc["schema"] == 1 and isinstance(doc["id"], str)
    assert doc["pull"] is None or (set(doc["pull"]) == {"files", "bytes", "complete", "problems"}
                                   and doc["pull"]["complete"] == (doc["pull"]["problems"] == [])), doc["pull"]
    assert doc["code"] is None or set(doc["code"]) == {"kept", "files", "bytes", "new_bytes", "withheld", "dirty",
                                                       "skipped"}, doc["code"]
    assert doc["metrics"] is None or set(doc["metrics"]) == {"names", "records", "dropped"}, doc["metrics"]
    for h in doc["hosts"]:
        assert set(h) == {"name", "address", "node_rank", "workdir", "environment"}, h
        assert h["environment"] is None or all(isinstance(v, str) for v in h["environment"].values()), h
    host_names = {h["name"] for h in doc["hosts"]}
    for k in doc["ranks"]:
        assert set(k) == RANK_FIELDS
        assert k["host"] in host_names  # a name, not an index
        for f in ("pid", "exit_code", "signal"):
            assert k[f] is None or (isinstance(k[f], int) and k[f] > (0 if f != "exit_code" else -1)), k
    if ended:
        assert isinstance(doc["exit_code"], int) and isinstance(doc["duration_s"], (int, float))
    assert doc["git_commit"] is None or doc["git_commit"]  # unknown is null, never ""
    assert doc["spec_file"] is None or doc["spec_file"]
    for v in doc.values():
        assert v != -1 and v != ""


def test_every_json_output_follows_the_documented_schema(ml):
    r = ml("run", "--json", "-n", "2", "--", "sh", "-c", '[ "$RANK" = 1 ] && exit 3; true')
    run_doc = json.loads(r.stdout[r.stdout.index("{"):])
    _check_run(run_doc)
    # Rank 1 exited on its own: no signal (null, not 0). Rank 0 may have been TERMed by then.
    assert run_doc["failure"]["rank"] == 1 and run_doc["ranks"][1]["signal"] is None
    assert run_doc["failure"]["reason"] == "rank_exit" and run_doc["ranks"][1]["host_lost"] is False
    # show: the run and its utilization summary (docs/json.md, "utilization"; this run was too short
    # for a sample, so null or a summary of what came).
    shown = json.loads(ml("show", "--json").stdout)
    _check_run(shown, fields=RUN_FIELDS | {"utilization", "metric_series"})
    assert shown["utilization"] is None or shown["utilization"]["samples"] >= 1
    assert shown["metric_series"] is None  # this run logged nothing
    ls = json.loads(ml("ls", "--json").stdout)
    assert set(ls) == {"schema", "runs"} and ls["schema"] == 1
    for x in ls["runs"]:
        assert set(x) == RUN_FIELDS - {"schema", "spec_text"}
    for args in (["run", "--dry-run", "--json", "-n", "2", "--", "true"], ["validate", "--json", "-n", "2", "--", "true"]):
        p = json.loads(ml(*args).stdout)
        assert p["schema"] == 1 and "id" in p and "run_id" not in p, args
        assert isinstance(p["world_size"], int) and isinstance(p["master_port"], int)
        assert all(isinstance(k["host"], str) for k in p["ranks"])
        assert all(h["user"] is None and h["port"] is None for h in p["hosts"])
        assert p["ps"] is None and all(h["ps_servers"] == 0 for h in p["hosts"])  # not PS mode
    k = json.loads(ml("knobs", "--json", env={"MLTRAIN_TOKEN": "abc"}).stdout)
    assert k["schema"] == 1
    assert {x["name"]: x["value"] for x in k["knobs"]}["MLTRAIN_TOKEN"] == "<secret>"
    d = json.loads(ml("doctor", "--json", timeout=60).stdout)
    assert d["schema"] == 1
    for h in d["hosts"]:
        assert isinstance(h["facts"]["gpus"], int), h  # a number, not "0"
        assert h["problem"] is None and h["stage"] is None
    b = ml("bench", "-b", "4K", "-e", "4K", "--iters", "1", "--warmup", "0", "--json", timeout=60)
    for line in b.stdout.splitlines():
        x = json.loads(line)
        assert x["schema"] == 1 and x["wrong"] is None
