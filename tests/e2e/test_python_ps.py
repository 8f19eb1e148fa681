"""Parameter-server mode from Python (`import mltrain.ps`, mltrain.torch.ps_hook) on local jobs
whose spec has a [ps] table: the servers run inside the agent of this host. Sync exactness for
every dtype at sizes below, at and above partition_bytes; pull before any push; the DDP ps_hook
example (weights identical on every worker); the async example converging; usage errors.
docs/python.md, "Parameter-server mode"."""
import re

import pytest

from conftest import REPO
from multihost_fixtures import python_has_torch

PY = "/usr/bin/python3"
HAS_TORCH, WHY_NOT = python_has_torch(PY)
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason=WHY_NOT)

PARTITION = 4096  # bytes: small, so that modest keys split into parts over the servers

# One worker of the exactness test. Pushes differ per worker, per round and per element, and are
# small integers, so every sum is exact in every dtype (u8: at most 10 x workers; bf16 up to 256).
EXACT = r'''
import os, sys
import numpy as np
import mltrain
import mltrain.ps as ps
try:
    import torch
except ImportError:
    torch = None

ROUNDS = int(sys.argv[1])
PART = int(os.environ["MLTRAIN_PS_PARTITION_BYTES"])
NP = ["float32", "float64", "float16", "int32", "int64", "uint8"]
TORCH = NP + ["bfloat16"]
ITEM = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint8": 1}

c = ps.init()
assert ps.init() is c
me, n = ps.worker(), ps.num_workers()
print("PS-INFO", me, n, ps.num_servers(), int(ps.is_sync()), PART, flush=True)
assert ps.is_sync()


def pushed(w, r, count):
    i = np.arange(count, dtype=np.int64)
    return (i * 7 + w * 3 + r * 5) % 11


def initial(count):
    return (np.arange(count, dtype=np.int64) * 3) % 13 + 1


def make(kind, dtype, v):
    if kind == "numpy":
        return np.asarray(v, dtype=dtype)
    return torch.tensor(v, dtype=torch.float64).to(getattr(torch, dtype))


def as_f64(x):
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return x.double().numpy()


checks = 0


def check(what, got, want):
    global checks
    g = as_f64(got)
    if g.shape != want.shape or not (g == want).all():
        bad = int(np.argmax(g != want)) if g.shape == want.shape else -1
        raise SystemExit(f"worker {me}: {what}: element {bad}: got {g.ravel()[bad]}, "
                         f"want {want.ravel()[bad]}")
    checks += 1


cases = []
for kind, dtypes in (("numpy", NP), ("torch", TORCH if torch is not None else [])):
    for dt in dtypes:
        per = PART // ITEM[dt]
        for count in sorted({1, per - 1, per, per + 1, 3 * per + 5}):
            cases.append((kind, dt, count, f"{kind}/{dt}/{count}"))

def want(count):
    """The sum of every worker's round-r push."""
    return sum(pushed(w, r, count) for w in range(n)).astype(np.float64)


# Declare with an initial value; a pull before any push returns it.
for kind, dt, count, key in cases:
    ps.declare(key, make(kind, dt, np.zeros(count)), init=make(kind, dt, initial(count)))
    assert ps.client().declared(key) == (count, dt)
    ps.declare(key, make(kind, dt, np.zeros(count)))  # the same again: a no-op
for kind, dt, count, key in cases:
    out = make(kind, dt, np.zeros(count))
    check(f"{key} pull before any push", ps.pull(key, out), initial(count).astype(np.float64))

r = 0
for _ in range(ROUNDS):
    if r % 2 == 0:  # blocking, in place
        for kind, dt, count, key in cases:
            x = make(kind, dt, pushed(me, r, count))
            check(f"{key} round {r} push_pull", ps.push_pull(key, x), want(count))
    else:  # every key in flight at once, into separate outputs
        flights = []
        for kind, dt, count, key in cases:
            x = make(kind, dt, pushed(me, r, count))
            out = make(kind, dt, np.zeros(count))
            flights.append((key, count, x, ps.push_pull_async(key, x, out=out)))
        for key, count, x, h in flights:
            res = h.wait()
            assert h.done()
            check(f"{key} round {r} push_pull_async", res, want(count))
            check(f"{key} round {r} push_pull_async input untouched", x,
                  pushed(me, r, count).astype(np.float64))
    r += 1

# Separate push and pull: blocking, then async (a push and the pull after it in flight together).
for mode in ("blocking", "async"):
    for kind, dt, count, key in cases:
        x = make(kind, dt, pushed(me, r, count))
        out = make(kind, dt, np.zeros(count))
        if mode == "blocking":
            ps.push(key, x)
            ps.pull(key, out)
        else:
            hp = ps.push_async(key, x)
            hl = ps.pull_async(key, out)
            assert hp.wait() is None and hl.wait() is out
        check(f"{key} round {r} push+pull ({mode})", out, want(count))
    r += 1

# A handle dropped unwaited waits by itself before its arrays can be freed.
for kind, dt, count, key in cases:
    x = make(kind, dt, pushed(me, r, count))
    ps.push_pull_async(key, x)
    check(f"{key} round {r} unwaited push_pull_async", x, want(count))
r += 1

print("PS-EXACT-OK", me, checks, len(cases), r, mltrain.library_path(), flush=True)
'''


def exact_spec(ml, workers, rounds, servers_per_host=2):
    script = ml.write("ps_exact.py", EXACT)
    return ml.write("ps_exact.toml", f'''
name = "ps-exact"
[run]
argv = ["{PY}", "{script}", "{rounds}"]
timeout = "4m"
[run.env]
OMP_NUM_THREADS = 1
[cluster]
procs_per_host = {workers}
[ps]
servers_per_host = {servers_per_host}
sync = true
partition_bytes = {PARTITION}
''')


def test_sync_push_pull_is_exactly_the_sum_for_every_dtype_and_size(ml):
    workers, rounds = 4, 6
    r = ml("run", exact_spec(ml, workers, rounds), timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    info = re.findall(r"PS-INFO (\d) (\d) (\d+) (\d) (\d+)", r.stdout)
    assert sorted(int(i[0]) for i in info) == list(range(workers)), r.stdout[-3000:]
    for _, n, servers, sync, part in info:
        assert (int(n), int(servers), int(sync), int(part)) == (workers, 2, 1, PARTITION), info
    oks = re.findall(r"PS-EXACT-OK (\d) (\d+) (\d+) (\d+) (\S+)", r.stdout)
    assert sorted(int(o[0]) for o in oks) == list(range(workers)), r.stdout[-3000:]
    # 5 sizes (1, one below, at, one above, 3 parts + 5 elements) x 6 numpy dtypes (+ 7 torch).
    ncases = (6 + 7 if HAS_TORCH else 6) * 5
    for _, checks, cases, done_rounds, lib in oks:
        assert int(cases) == ncases, cases
        assert int(done_rounds) == rounds + 3
        # per case: the initial pull, a check per round (two for async rounds), 2 push+pull, unwaited
        assert int(checks) == int(cases) * (1 + rounds + rounds // 2 + 2 + 1), (checks, cases)
        assert lib.endswith("lib/libmltrain-comm.so.0"), lib


def test_sync_exactness_with_one_server_and_odd_worker_count(ml):
    # One server holds every part; 3 workers: rounds still never mix.
    r = ml("run", exact_spec(ml, 3, 4, servers_per_host=1), timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert len(re.findall(r"PS-EXACT-OK", r.stdout)) == 3, r.stdout[-3000:]
    assert all(i[2] == "1" for i in re.findall(r"PS-INFO (\d) (\d) (\d+)", r.stdout)), r.stdout[-2000:]


@needs_torch
def test_ddp_ps_hook_example_ends_with_identical_weights(ml):
    r = ml("run", REPO / "examples/ps/ddp_ps.toml", timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    digests = re.findall(r"rank (\d) final weights sha256 (\w+)", r.stdout)
    assert sorted(int(d[0]) for d in digests) == [0, 1, 2, 3], r.stdout[-3000:]
    assert len({d[1] for d in digests}) == 1, digests
    # It trained: the loss went down on rank 0.
    losses = [float(x) for x in re.findall(r"rank 0/4 step \d+ loss ([0-9.]+)", r.stdout)]
    assert len(losses) >= 3 and losses[-1] < losses[0], losses


def test_async_sgd_example_converges(ml):
    r = ml("run", REPO / "examples/ps/async_sgd.toml", timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    errs = {int(w): float(e) for w, e in re.findall(r"worker (\d): max \|w - w\*\| = (\S+)", r.stdout)}
    assert sorted(errs) == [0, 1, 2], r.stdout[-3000:]
    assert errs[0] <= 1e-3, errs


def test_async_sgd_example_fails_when_it_cannot_converge(ml):
    # Too few steps: worker 0 says so and the job fails (the example's check has teeth).
    spec = (REPO / "examples/ps/async_sgd.toml").read_text()
    assert '"--steps", "300"' in spec and 'workdir = "."' in spec
    spec = spec.replace('"--steps", "300"', '"--steps", "2"').replace(
        'workdir = "."', f'workdir = "{REPO / "examples/ps"}"')
    r = ml("run", ml.write("async_sgd_short.toml", spec), timeout=300)
    assert r.returncode != 0, r.stdout[-3000:]
    assert "worker 0: did not converge" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]


ERRORS = r'''
import sys
import numpy as np
import mltrain
import mltrain.ps as ps

try:
    ps.worker()
except ValueError as e:
    print("E0", e, flush=True)
ps.init()
me = ps.worker()
ps.declare(1, np.zeros(10, np.float32))
for what, call in [
    ("E1", lambda: ps.pull(99, np.zeros(10, np.float32))),
    ("E2", lambda: ps.push("nope", np.zeros(10, np.float32))),
]:
    try:
        call()
        print(what, "no error", flush=True)
    except mltrain.CommError as e:
        print(what, "CommError", e.code, e, flush=True)
for what, call in [
    ("E3", lambda: ps.push(1, np.zeros(11, np.float32))),
    ("E4", lambda: ps.pull(1, np.zeros(10, np.float64))),
    ("E5", lambda: ps.declare(2, (3, 4))),
    ("E6", lambda: ps.declare(2, 5, dtype=bool)),
    ("E7", lambda: ps.push_pull(1, np.zeros((10, 2), np.float32)[:, 0])),
    ("E8", lambda: ps.declare(-1, 5, dtype="float32")),
]:
    try:
        call()
        print(what, "no error", flush=True)
    except (ValueError, TypeError) as e:
        print(what, type(e).__name__, e, flush=True)
# Python-side usage errors leave the client working.
x = np.ones(10, np.float32)
ps.push_pull(1, x)
print("SUM", float(x[0]), flush=True)
# Declaring a key again with another count goes to the library, which refuses it.
try:
    ps.declare(1, np.zeros(12, np.float32))
    print("E9 no error", flush=True)
except mltrain.CommError as e:
    print("E9 CommError", e.code, e, flush=True)
'''


def test_usage_errors_raise_clear_errors(ml):
    script = ml.write("ps_errors.py", ERRORS)
    ml.write("ps_errors.toml", f'''
[run]
argv = ["{PY}", "{script}"]
timeout = "2m"
[cluster]
procs_per_host = 2
[ps]
sync = true
''')
    r = ml("run", "ps_errors.toml", timeout=120)
    out = r.stdout
    lines = {}
    for l in out.splitlines():
        m = re.match(r"\[0\] (E\d|SUM) (.*)", l)
        if m:
            lines[m[1]] = m[2]
    assert lines.get("E0") == "mltrain.ps is not initialized: call mltrain.ps.init() first", out[-3000:]
    assert re.match(r"CommError usage mltrain-comm: ps worker 0: pull of key 99: the key is not declared; "
                    r"every worker calls ps.declare\(key, \.\.\.\) for it first", lines["E1"]), lines
    assert "push of key 'nope': the key is not declared" in lines["E2"], lines
    assert lines["E3"] == "ValueError ps.push: key 1 is declared as 10 x float32; this array is 11 x float32"
    assert lines["E4"] == "ValueError ps.pull: key 1 is declared as 10 x float32; this array is 10 x float64"
    assert lines["E5"].startswith("TypeError ps.declare(key 2): a shape needs a dtype"), lines
    assert lines["E6"].startswith("TypeError ps.declare: dtype <class 'bool'> is not supported"), lines
    assert lines["E7"].startswith("ValueError ps.push_pull (key 1): the array is not C-contiguous"), lines
    assert lines["E8"] == "ValueError ps: key -1 is out of range 0 .. 2**64-1", lines
    assert lines["SUM"] == "2.0", lines
    # The library's own message: names the key and says what differs.
    assert lines["E9"].startswith("CommError "), lines
    assert re.search(r"\bkey 1\b", lines["E9"]) and re.search(r"count|mismatch|declared", lines["E9"]), lines


def test_init_without_servers_says_how_to_get_them(ml):
    # No [ps] table: the launcher starts no servers and sets no MLTRAIN_PS_SERVERS.
    r = ml("run", "-n", "1", "--", PY, "-c",
           "import mltrain, mltrain.ps as ps\n"
           "try:\n    ps.init()\nexcept mltrain.CommError as e:\n    print('RAISED', e.code, e)\n",
           timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"RAISED \w+ .*MLTRAIN_PS_SERVERS is not set.*\[ps\]", r.stdout), r.stdout[-2000:]
