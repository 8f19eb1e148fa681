"""`import mltrain` on the ranks of a local job, from what the agent delivered: every collective on
numpy arrays and torch tensors, the DDP hooks against gloo, DistributedOptimizer, a rank killed
mid-step, clear errors, the runtime repaired after damage, `[run] python_path = false` with the
package pip-installed into a venv. The same across test-cluster hosts: test_multihost_python.py."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from multihost_fixtures import python_has_torch

WORKERS = Path(__file__).resolve().parent / "py_workers"
PY = "/usr/bin/python3"
HAS_TORCH, WHY_NOT = python_has_torch(PY)
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason=WHY_NOT)

# DDP through the mltrain hook against DDP through gloo, float32, 30 SGD steps: the sums differ
# only in the order of additions (docs/python.md). Bitwise for the fixed-point hook.
WEIGHT_TOL = 1e-5


def runtime_dir(ml):
    dirs = sorted((ml.home / "agent").glob("runtime-*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_every_op_and_dtype_on_4_ranks(ml):
    r = ml("run", "-n", "4", "--", PY, WORKERS / "ops.py", timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rt = runtime_dir(ml)
    oks = re.findall(r"^\[(\d)\] OPS-OK (\d+) (\S+) (\S+)$", r.stdout, re.M)
    assert sorted(int(o[0]) for o in oks) == [0, 1, 2, 3], r.stdout[-3000:]
    for _, checks, pkg, lib in oks:
        # numpy x 6 dtypes and torch x 7 dtypes, every op, blocking and async.
        assert int(checks) >= (6 + 7) * (5 * 2 + 4 + 2 + 5), checks
        # The package and the library the agent unpacked, by absolute path.
        assert pkg == str(rt / "python" / "mltrain" / "__init__.py"), pkg
        assert lib == str(rt / "lib" / "libmltrain-comm.so.0"), lib


def test_rank_environment_names_the_runtime_and_nothing_on_ld_library_path(ml):
    r = ml("run", "-n", "1", "--", "sh", "-c",
           'echo "RT=$MLTRAIN_RUNTIME LIB=$MLTRAIN_COMM_LIB PP=$PYTHONPATH LD=${LD_LIBRARY_PATH:-none}"',
           env={"PYTHONPATH": "/opt/mine"})
    assert r.returncode == 0, r.stderr
    rt = runtime_dir(ml)
    assert f"RT={rt} LIB={rt}/lib/libmltrain-comm.so.0 PP={rt}/python:/opt/mine LD=none" in r.stdout, r.stdout


def _weights(out, mode, n):
    import numpy as np
    ws = [np.fromfile(out / f"weights-{mode}-{k}.bin", dtype=np.float32) for k in range(n)]
    for k, w in enumerate(ws):
        assert w.tobytes() == ws[0].tobytes(), f"{mode}: rank {k}'s weights differ from rank 0's"
    return ws[0]


def ddp_modes(run, out, n, modes=("gloo", "hook", "fixed", "gloo-fixed", "optimizer")):
    """Runs py_workers/ddp.py once per mode and checks the weights (shared with the cluster test)."""
    import numpy as np
    for mode in modes:
        r = run(mode)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        assert len(re.findall(rf"DDP-DONE {mode} rank \d", r.stdout)) == n, r.stdout[-2000:]
    w = {m: _weights(out, m, n) for m in modes}
    assert np.isfinite(w["gloo"]).all() and np.abs(w["gloo"]).max() > 0
    for m in ("hook", "optimizer"):
        diff = float(np.abs(w[m] - w["gloo"]).max())
        assert diff <= WEIGHT_TOL, f"{m}: max |w - w_gloo| = {diff}"
    # Fixed point: the sums are exact, so mltrain and gloo end bit for bit the same.
    assert w["fixed"].tobytes() == w["gloo-fixed"].tobytes()


@needs_torch
def test_ddp_hook_and_optimizer_match_gloo(ml, tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    def run(mode):
        return ml("run", "-n", "4", "--env", f"OUT={out}", "--env", "OMP_NUM_THREADS=1", "--",
                  PY, WORKERS / "ddp.py", "--mode", mode, timeout=180)
    ddp_modes(run, out, 4)


def _ddp_on_4_ranks(ml, out, mode):
    """py_workers/ddp.py in one mode on 4 ranks of this host; its output, once it succeeded."""
    r = ml("run", "-n", "4", "--env", f"OUT={out}", "--env", "OMP_NUM_THREADS=1", "--",
           PY, WORKERS / "ddp.py", "--mode", mode, timeout=180)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout


@needs_torch
def test_ddp_hook_reads_buckets_where_they_lie_and_stages_when_dev_shm_is_full(ml, tmp_path):
    """On one host the hook moves DDP's buckets into shared memory, where the other ranks read
    them; when /dev/shm looks too small it leaves them and stages; with gradient_as_bucket_view
    every rank writes its part of the result into every rank's bucket. All reduce in the same
    order: the same weights, bit for bit."""
    out = tmp_path / "out"
    out.mkdir()
    w = {}
    for mode in ("hook", "hook-staged", "hook-view"):
        stdout = _ddp_on_4_ranks(ml, out, mode)
        counts = [(int(a), int(b)) for a, b in re.findall(r"BUCKETS (\d+) OF (\d+)", stdout)]
        views = [(int(a), int(b)) for a, b in re.findall(r"VIEWS (\d+) OF (\d+)", stdout)]
        assert len(counts) == 4 and all(calls > 0 for _, calls in counts), stdout[-2000:]
        if mode == "hook-staged":
            assert all(shared == 0 for shared, _ in counts), counts
        else:
            assert all(shared == calls for shared, calls in counts), counts
        # hook-view: gradients are views into the buckets, so the hook writes every rank's result
        # into every rank's bucket (allreduce_mapped); the others get the result in a region.
        assert all(v == (calls if mode == "hook-view" else 0) for v, calls in views), (mode, views)
        w[mode] = _weights(out, mode, 4)
    assert w["hook"].tobytes() == w["hook-staged"].tobytes()
    assert w["hook-view"].tobytes() == w["hook"].tobytes()


def _hook_trains_as_gloo(ml, tmp_path, what):
    """py_workers/ddp.py as <what>-gloo and <what>-hook on 4 ranks: the same weights on every
    rank, and the hook's within WEIGHT_TOL of gloo's."""
    import numpy as np
    out = tmp_path / "out"
    out.mkdir()
    w = {}
    for mode in (f"{what}-gloo", f"{what}-hook"):
        _ddp_on_4_ranks(ml, out, mode)
        w[mode] = _weights(out, mode, 4)
    diff = float(np.abs(w[f"{what}-hook"] - w[f"{what}-gloo"]).max())
    assert diff <= WEIGHT_TOL, f"max |w - w_gloo| = {diff}"


@needs_torch
def test_two_ddp_models_in_one_backward_pass_keep_their_results_apart(ml, tmp_path):
    """The hook hands DDP its results in shared memory, one region per bucket: the buckets of two
    models of the same shape are in flight at once and must not share one."""
    _hook_trains_as_gloo(ml, tmp_path, "twin")


@needs_torch
def test_ddp_hook_with_bucket_views_where_one_rank_computes_none_of_a_bucket(ml, tmp_path):
    """gradient_as_bucket_view=True with gradients set to None each step: rank 1 never uses one
    head, so its gradients of that bucket stay None and it cannot tell that they view the bucket
    while its peers can. The call must still agree, and train as gloo does."""
    _hook_trains_as_gloo(ml, tmp_path, "branch")


@needs_torch
def test_rank_killed_mid_step_raises_on_the_others_naming_it(ml, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = ml("run", "-n", "3", "--grace-period", "30s", "--env", "MLTRAIN_COMM_TIMEOUT=5s",
           "--env", f"OUT={out}", "--", PY, WORKERS / "ddp.py", "--mode", "hook", "--kill-at", "5",
           timeout=120)
    assert r.returncode == 137, r.stderr[-3000:]
    rec = json.loads(ml("show", "--json").stdout)
    ranks = {x["rank"]: x for x in rec["ranks"]}
    for k in (0, 2):
        # It ended by itself with the error (exit 3), not by the launcher's KILL after the grace.
        assert ranks[k]["exit_code"] == 3 and ranks[k]["signal"] is None, rec["ranks"]
        log = (ml.runs_dir / rec["id"] / f"rank-{k}.log").read_text(errors="replace")
        raised = log[log.index("RAISED"):] if "RAISED" in log else ""
        assert "CommError: mltrain-comm: rank" in raised, log[-2000:]
        assert re.search(r"rank 1 \(\S+\)", raised), raised


ERRORS = r'''
import os, sys
import numpy as np
import mltrain
try:
    mltrain.rank()
except ValueError as e:
    print("E1", e)
c = mltrain.init()
for what, call in [
    ("E2", lambda: mltrain.allreduce(np.ones((4, 4), np.float32)[:, 1])),
    ("E3", lambda: mltrain.allreduce(np.ones(4, bool))),
    ("E4", lambda: mltrain.allreduce([1.0, 2.0])),
    ("E5", lambda: mltrain.allreduce(np.ones(4, np.float32), "median")),
    ("E6", lambda: mltrain.reduce_scatter(np.ones(5, np.float32))),
    ("E7", lambda: mltrain.broadcast(np.ones(4, np.float32), root=7)),
]:
    try:
        call()
        print(what, "no error")
    except (ValueError, TypeError) as e:
        print(what, type(e).__name__, e)
x = np.arange(6, dtype=np.float32)
x.setflags(write=False)
try:
    mltrain.allreduce(x)
except ValueError as e:
    print("E8", e)
'''


def test_bad_arguments_get_clear_errors(ml, tmp_path):
    script = ml.write("errors.py", ERRORS)
    r = ml("run", "-n", "2", "--", PY, script, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out = "\n".join(l.split("] ", 1)[1] for l in r.stdout.splitlines() if l.startswith("[0]"))
    assert "E1 mltrain is not initialized: call mltrain.init() first" in out
    assert "E2 ValueError allreduce: the array is not C-contiguous" in out
    assert "E3 TypeError allreduce: dtype bool is not supported; use one of float32" in out
    assert "E4 TypeError allreduce: expected a numpy array or a torch tensor, not list" in out
    assert "E5 ValueError op 'median': use one of sum, prod, min, max, avg" in out
    assert "E6 ValueError reduce_scatter: 5 elements do not split into 2 equal blocks" in out
    assert "E7 ValueError broadcast: root 7 is not a rank (size 2)" in out
    assert "E8 allreduce: the array is read-only" in out


def test_library_missing_is_a_clear_import_error(ml):
    r = ml("run", "-n", "1", "--env", "MLTRAIN_COMM_LIB=/nonexistent/libmltrain-comm.so.0", "--",
           PY, "-c", "import mltrain; mltrain.init()", timeout=60)
    assert r.returncode == 1
    assert "ImportError: cannot load libmltrain-comm from /nonexistent/libmltrain-comm.so.0" in r.stdout + r.stderr


def test_damaged_runtime_is_repaired_by_the_next_job(ml):
    probe = ["--", PY, "-c", "import mltrain, numpy as np; mltrain.init(); "
             "x = mltrain.allreduce(np.ones(8, np.int32)); print('SUM', int(x[0]), mltrain.__file__)"]
    r = ml("run", "-n", "2", *probe, timeout=60)
    assert r.returncode == 0, r.stderr
    rt = runtime_dir(ml)
    files = {p.relative_to(rt): (p.read_bytes(), p.stat().st_mode & 0o7777) for p in rt.rglob("*") if p.is_file()}
    assert Path("lib/libmltrain-comm.so.0") in files and Path("python/mltrain/torch.py") in files
    # A truncated library, a deleted module, one edited, one whose mode changed.
    lib = rt / "lib/libmltrain-comm.so.0"
    lib.write_bytes(lib.read_bytes()[:4096])
    (rt / "python/mltrain/torch.py").unlink()
    init = rt / "python/mltrain/__init__.py"
    init.write_text(init.read_text().replace("def init(", "def broken_init("))
    (rt / "python/mltrain/_capi.py").chmod(0o600)
    r = ml("run", "-n", "2", *probe, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("SUM 2 ") == 2, r.stdout
    now = {p.relative_to(rt): (p.read_bytes(), p.stat().st_mode & 0o7777) for p in rt.rglob("*")
           if p.is_file() and "__pycache__" not in p.parts}
    assert now == {k: v for k, v in files.items() if "__pycache__" not in k.parts}


def test_python_path_false_and_the_package_pip_installed_in_a_venv(ml, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    src = tmp_path / "pkg"
    shutil.copytree(REPO / "python", src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    p = subprocess.run([str(venv / "bin/pip"), "install", "-q", "--no-build-isolation", "--no-index", str(src)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    ml.write("job.toml", f'''
[run]
argv = ["{venv}/bin/python", "-c", "import mltrain, numpy as np, os; mltrain.init(); x = mltrain.allreduce(np.ones(3)); print('PKG', mltrain.__file__, x[0], os.environ.get('PYTHONPATH', 'unset'))"]
python_path = false
[cluster]
hosts = ["localhost:2"]
''')
    r = ml("run", "job.toml", timeout=60, unset=("PYTHONPATH",))
    assert r.returncode == 0, r.stderr
    lines = re.findall(r"PKG (\S+) (\S+) (\S+)", r.stdout)
    assert len(lines) == 2, r.stdout
    for pkg, total, pythonpath in lines:
        assert pkg.startswith(str(venv)) and pkg.endswith("site-packages/mltrain/__init__.py"), pkg
        assert total == "2.0" and pythonpath == "unset"
    d = ml("run", "job.toml", "--dry-run", "--json", timeout=30)
    assert d.returncode == 0 and json.loads(d.stdout)["python_path"] is False, d.stdout[-2000:]
    d = ml("run", "job.toml", "--dry-run", timeout=30)
    assert "PYTHONPATH left alone ([run] python_path = false)" in d.stdout, d.stdout


def test_numpy_example(ml):
    r = ml("run", REPO / "examples/numpy.toml", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[0] weights identical on all 4 ranks" in r.stdout, r.stdout[-2000:]
    err = float(re.search(r"max \|w - true_w\| = ([0-9.]+)", r.stdout)[1])
    assert err < 0.01, r.stdout[-2000:]


@needs_torch
def test_ddp_example_with_the_hook(ml):
    r = ml("run", REPO / "examples/ddp_mltrain.toml", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    digests = set(re.findall(r"final weights sha256 (\w+)", r.stdout))
    assert len(re.findall(r"final weights sha256", r.stdout)) == 2 and len(digests) == 1, r.stdout[-2000:]


def test_ranks_that_exit_right_after_init_do_not_break_the_others(ml):
    # Rank 0 hosts the store and every rank its shared-memory bell: a rank leaving at once after
    # init must not pull them from under a peer still joining (init ends with a barrier).
    script = ml.write("quick.py", "import mltrain; mltrain.init(); print('JOINED', mltrain.rank())\n")
    for attempt in range(15):
        r = ml("run", "-n", "4", "--", PY, script, timeout=60)
        assert r.returncode == 0, f"attempt {attempt}: {(r.stdout + r.stderr)[-3000:]}"
        assert r.stdout.count("JOINED") == 4, r.stdout


# PYTHONUNBUFFERED.
def test_ranks_get_pythonunbuffered_unless_the_user_set_it(ml):
    sh = ["sh", "-c", 'echo "unbuf=${PYTHONUNBUFFERED:-unset}"']
    r = ml("run", "-n", "2", "--", *sh, unset=("PYTHONUNBUFFERED",))
    assert r.returncode == 0 and r.stdout.count("unbuf=1") == 2, r.stdout
    r = ml("run", "-n", "1", "--env", "PYTHONUNBUFFERED=", "--", *sh)
    assert "unbuf=unset" in r.stdout, r.stdout
    # A Python rank's line reaches the console while it still runs.
    p = ml.popen("run", "-n", "1", "--", "python3", "-c",
                 "import time; print('early line'); time.sleep(30)", unset=("PYTHONUNBUFFERED",))
    got = b""
    os.set_blocking(p.stdout.fileno(), False)
    deadline = time.time() + 10
    while time.time() < deadline and b"early line" not in got:
        got += p.stdout.read() or b""
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=20)
    assert b"early line" in got, got
