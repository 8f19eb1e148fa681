"""`import mltrain` across the hosts of the test cluster (tests/cluster/), from what the launcher
delivered into a clean home: every op x dtype on numpy and torch (3 hosts x 2 ranks), the DDP
hooks and DistributedOptimizer against gloo, a rank killed mid-step, `mltrain bench` from the
delivered benchmark. Ranks run as the cluster's login user; worker scripts and outputs live in
mh.shared. The same on one host: test_python.py."""
import json
import pwd
import re
import shutil
from pathlib import Path

import pytest

from multihost_fixtures import cluster, mh, python_has_torch, shared_root  # noqa: F401
from test_python import PY, WORKERS, ddp_modes

USER = "mltest"
HAS_TORCH, WHY_NOT = python_has_torch(PY)
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason=WHY_NOT)


def user_cache():
    return Path(pwd.getpwnam(USER).pw_dir) / ".cache" / "mltrain"


def copy_workers(mh):
    d = mh.shared / "py_workers"
    shutil.copytree(WORKERS, d, ignore=shutil.ignore_patterns("__pycache__"))
    d.chmod(0o755)
    for p in d.iterdir():
        p.chmod(0o644)
    return d


def test_clean_home_gets_import_mltrain_and_bench_from_the_launcher(mh, cluster):
    # Nothing of mltrain on the hosts: no agent, no runtime in the user's cache.
    shutil.rmtree(user_cache(), ignore_errors=True)
    probe = ("import mltrain, numpy as np, os, socket; mltrain.init(); "
             "x = mltrain.allreduce(np.ones(4, np.int64)); mltrain.log(step=7, total=float(x[0])); "
             "print('PROBE', socket.gethostname(), int(x[0]), mltrain.__file__, mltrain.library_path(), "
             "os.environ.get('LD_LIBRARY_PATH', 'none'))")
    r = mh.run("-H", "h1:1,h2:1,h3:1", "--workdir", "/tmp", "--", PY, "-c", probe, timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    rows = re.findall(r"PROBE (\S+) (\d+) (\S+) (\S+) (\S+)", r.stdout)
    assert len(rows) == 3, r.stdout
    runtimes = sorted(user_cache().glob("runtime-*"))
    assert len(runtimes) == 1, runtimes
    rt = runtimes[0]
    for host, total, pkg, lib, ld in rows:
        assert total == "3" and ld == "none", rows
        assert pkg == str(rt / "python/mltrain/__init__.py") and lib == str(rt / "lib/libmltrain-comm.so.0"), rows
    assert {row[0] for row in rows} == {"h1", "h2", "h3"}, rows
    # mltrain.log from every host's ranks through its agent; each host's environment recorded.
    run = mh.show()
    lines = [json.loads(l) for l in (mh.latest_run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert sorted((l["rank"], l["step"], l["total"]) for l in lines) == [(0, 7, 3.0), (1, 7, 3.0), (2, 7, 3.0)]
    assert run["metric_series"]["total"]["last"] == 3.0
    for h in run["hosts"]:
        assert h["environment"]["python"].endswith(f"({PY})") and h["environment"]["kernel"], h

    b = mh.ml("bench", *mh.args("-H", "h1:1,h2:1,h3:1"), "-b", "64K", "-e", "1M", "-f", "4",
              "--iters", "3", "--warmup", "1", "--check", timeout=120)
    assert b.returncode == 0, (b.stdout + b.stderr)[-3000:]
    rows = [l.split() for l in b.stdout.splitlines() if l.strip() and not l.startswith("#")]
    assert [int(x[0]) for x in rows] == [65536, 262144, 1048576], b.stdout
    assert all(x[-1] == "0" for x in rows), b.stdout
    assert "3 ranks" in b.stdout


def test_every_op_and_dtype_on_3_hosts_x_2_ranks(mh, cluster):
    workers = copy_workers(mh)
    r = mh.run("-H", "h1:2,h2:2,h3:2", "--workdir", "/tmp", "--", PY, workers / "ops.py", timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    oks = re.findall(r"^\[\w+:(\d)\] OPS-OK (\d+) ", r.stdout, re.M)  # "[h1:0] ..."
    assert sorted(int(o[0]) for o in oks) == list(range(6)), r.stdout[-3000:]


@needs_torch
def test_ddp_hook_and_optimizer_match_gloo_3_hosts_x_2_ranks(mh, cluster):
    workers = copy_workers(mh)

    def run(mode):
        return mh.run("-H", "h1:2,h2:2,h3:2", "--workdir", "/tmp", "--env", f"OUT={mh.shared}",
                      "--env", "OMP_NUM_THREADS=1", "--", PY, workers / "ddp.py", "--mode", mode, timeout=300)
    ddp_modes(run, mh.shared, 6)


@needs_torch
def test_rank_killed_mid_step_raises_on_the_other_hosts_naming_it(mh, cluster):
    workers = copy_workers(mh)
    r = mh.run("-H", "h1:1,h2:1,h3:1", "--workdir", "/tmp", "--grace-period", "30s",
               "--env", "MLTRAIN_COMM_TIMEOUT=5s", "--env", f"OUT={mh.shared}", "--",
               PY, workers / "ddp.py", "--mode", "hook", "--kill-at", "5", timeout=180)
    assert r.returncode == 137, r.stderr[-3000:]
    ranks = {x["rank"]: x for x in mh.show()["ranks"]}
    for k in (0, 2):
        assert ranks[k]["exit_code"] == 3 and ranks[k]["signal"] is None, ranks
        log = mh.rank_log(k)
        raised = log[log.index("RAISED"):] if "RAISED" in log else ""
        assert "CommError: mltrain-comm: rank" in raised, log[-2000:]
        assert "rank 1 (h2)" in raised, raised
