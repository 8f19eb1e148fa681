"""Elastic restarts on the test cluster (docs/elastic.md): a 4-host DDP job whose h3 link is cut
mid-training restarts without h3 (min_hosts = 3), or with the spare h5 in its place, resumes from
rank 0's checkpoint (MLTRAIN_CHECKPOINT_DIR) and ends with the same weights on every rank."""
import json
import re
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

from conftest import unique_marker
from multihost_fixtures import MAX_SESSIONS, module_cluster, mh, shared_root  # noqa: F401 (fixtures)
from test_python import PY, needs_torch

cluster = module_cluster(n=5, max_sessions=MAX_SESSIONS)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic"


def elastic_job(mh, cluster, extra):
    d = mh.shared / "elastic"
    d.mkdir()
    d.chmod(0o755)
    shutil.copy(EXAMPLE / "train.py", d / "train.py")
    (d / "train.py").chmod(0o644)
    spec = d / "job.toml"
    spec.write_text(f"""name = "elastic"
[run]
argv = ["{PY}", "train.py", "--steps", "60", "--every", "2", "--step-seconds", "0.2"]
workdir = "{d}"
max_restarts = 2
timeout = "4m"
[run.env]
OMP_NUM_THREADS = 1
[cluster]
hosts = ["h1", "h2", "h3", "h4"]
procs_per_host = 1
{extra}
[ssh]
config = "{cluster.ssh_config}"
""")
    return spec


def _log0(mh):
    try:
        return mh.rank_log(0)
    except (AssertionError, OSError):
        return ""


def cut_h3_mid_training(mh, cluster, spec):
    """Runs the job, cuts h3 once rank 0 is past step 8; (the run's record, its output, cut time)."""
    p = mh.ml.popen("run", str(spec), text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if re.search(r"step (9|[1-9]\d) ", _log0(mh)):
            break
        assert p.poll() is None, p.communicate()
        time.sleep(0.1)
    else:
        raise AssertionError("rank 0 never got past step 8")
    cut_at = time.time()
    cluster.cut("h3")
    out, err = p.communicate(timeout=200)
    assert p.returncode == 0, (out + err)[-4000:]
    return json.loads((mh.latest_run_dir() / "run.json").read_text()), out + err, cut_at


def at(iso):
    return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def check_resumed(run_dir, ranks):
    """After the restart every rank resumes at the checkpoint's step and counts on from there;
    the ranks of the last generation end with one digest."""
    steps, digests = set(), set()
    for r in range(ranks):
        log = (run_dir / f"rank-{r}.log").read_text()
        after = log[log.index("==> mltrain: restart 1 of 2"):]
        resumed = re.search(r"rank \d+ resumed from step (\d+)", after)
        assert resumed, after[:2000]
        step = int(resumed.group(1))
        first = re.search(r"rank \d+/\d+ step (\d+) ", after)
        assert first and int(first.group(1)) == step, after[:2000]  # the step counter goes on
        steps.add(step)
        digest = re.search(r"final weights sha256 (\w+)", after)
        assert digest, after[-2000:]
        digests.add(digest.group(1))
    assert len(steps) == 1 and min(steps) >= 8, steps
    assert len(digests) == 1, digests


@needs_torch
def test_a_cut_host_leaves_the_gang_and_training_resumes_on_three(mh, cluster):  # noqa: F811
    rec, out, cut_at = cut_h3_mid_training(mh, cluster, elastic_job(mh, cluster, "min_hosts = 3"))
    gens = rec["generations"]
    assert [g["hosts"] for g in gens] == [["h1", "h2", "h3", "h4"], ["h1", "h2", "h4"]], gens
    assert [g["world_size"] for g in gens] == [4, 3]
    assert "h3" in gens[1]["why"] and "without h3, on 3 hosts" in gens[1]["why"], gens[1]
    delay = at(gens[1]["started_at"]) - cut_at
    print(f"restarted on 3 hosts {delay:.1f} s after the cut")  # -s shows it (docs/elastic.md)
    assert delay <= 20, (gens[1]["started_at"], cut_at)  # the must-hold: 10 s to notice, then the regroup
    assert "restarting the gang (restart 1 of 2): without h3, on 3 hosts" in out
    assert "rank 2/3 on h4 restart 1" in out  # numbered anew: h4 is node 2 now
    check_resumed(mh.latest_run_dir(), 3)
    assert rec["restarts"] == 1 and rec["status"] == "succeeded"
    assert [r["host"] for r in rec["ranks"]] == ["h1", "h2", "h4"]


@needs_torch
def test_a_spare_takes_the_cut_hosts_place(mh, cluster):  # noqa: F811
    rec, out, cut_at = cut_h3_mid_training(mh, cluster,
                                          elastic_job(mh, cluster, 'min_hosts = 3\nspares = ["h5"]'))
    gens = rec["generations"]
    assert [g["hosts"] for g in gens] == [["h1", "h2", "h3", "h4"], ["h1", "h2", "h5", "h4"]], gens
    assert [g["world_size"] for g in gens] == [4, 4]
    assert "h5 in place of h3" in gens[1]["why"]
    assert at(gens[1]["started_at"]) - cut_at <= 20
    assert "rank 2/4 on h5 restart 1" in out
    check_resumed(mh.latest_run_dir(), 4)
    show = mh.ml("show", rec["id"])
    assert "generations" in show.stdout and "4 ranks on h1, h2, h5, h4" in show.stdout, show.stdout


@needs_torch
def test_too_few_hosts_left_ends_the_run_and_says_why(mh, cluster):  # noqa: F811
    spec = elastic_job(mh, cluster, "min_hosts = 4")
    p = mh.ml.popen("run", str(spec), text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not re.search(r"step [3-9] ", _log0(mh)):
        time.sleep(0.1)
    cluster.cut("h3")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 255, (out + err)[-3000:]  # a lost host, as without min_hosts
    assert "not restarting: 3 of the gang's hosts are left (without h3, no spare ready), fewer than [cluster] " \
           "min_hosts = 4" in err


@needs_torch
def test_a_spare_that_cannot_be_reached_is_left_out_and_the_job_runs(mh, cluster):  # noqa: F811
    cluster.cut("h5")
    spec = elastic_job(mh, cluster, 'min_hosts = 3\nspares = ["h5"]')
    spec.write_text(spec.read_text().replace('"--steps", "60"', '"--steps", "4"'))
    r = mh.ml("run", spec, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"spare h5 .*is left out: .*", r.stderr), r.stderr
    rec = json.loads((mh.latest_run_dir() / "run.json").read_text())
    assert [g["hosts"] for g in rec["generations"]] == [["h1", "h2", "h3", "h4"]]


def test_a_host_whose_ranks_cannot_start_at_a_restart_is_left_out(mh, cluster):  # noqa: F811
    """h3's rank fails and takes its workdir with it (each host has a /dev/shm of its own): at the
    restart h3's ranks cannot start, so the gang restarts again without it, not on the same hosts
    until the restarts run out."""
    work = f"/dev/shm/mlt-elastic-{unique_marker()}"
    hosts = ["h1", "h2", "h3"]
    for h in hosts:
        cluster.run(h, ["mkdir", "-p", work], check=True)
    spec = mh.shared / "cannot-start.toml"
    spec.write_text(f"""name = "cannot-start"
[run]
command = '''
if [ "$TORCHELASTIC_RESTART_COUNT" = 2 ]; then echo "rank $RANK of $WORLD_SIZE on $(hostname)"; exit 0; fi
if [ "$(hostname)" = h3 ]; then rm -rf "$PWD"; exit 3; fi
exec sleep 60
'''
workdir = "{work}"
max_restarts = 3
[cluster]
hosts = {json.dumps(hosts)}
min_hosts = 2
[ssh]
config = "{cluster.ssh_config}"
""")
    try:
        r = mh.ml("run", spec, timeout=120)
    finally:
        for h in hosts:
            cluster.run(h, ["rm", "-rf", work])
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads((mh.latest_run_dir() / "run.json").read_text())
    assert [g["hosts"] for g in rec["generations"]] == [hosts, hosts, ["h1", "h2"]], rec["generations"]
    why = rec["generations"][2]["why"]
    assert f"chdir to '{work}'" in why and "without h3 (its ranks could not start), on 2 hosts" in why, why
    assert rec["restarts"] == 2
    assert "rank 1 of 2 on h2" in r.stdout, r.stdout
