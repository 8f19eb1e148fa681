"""mltrain bench on localhost: the benchmark job launched through the job API, its table, JSON and
run record (the multi-host bench is in test_multihost.py)."""
import json
import re


def _rows(stdout):
    return [l.split() for l in stdout.splitlines() if l.strip() and not l.startswith("#")]


def test_bench_table_with_check(ml):
    r = ml("bench", "-n", "3", "-b", "4K", "-e", "16K", "-f", "2", "--iters", "2", "--warmup", "1", "--check",
           timeout=60)
    assert r.returncode == 0, r.stderr
    header = [l for l in r.stdout.splitlines() if l.startswith("#") and "#wrong" in l]
    # Only rank 0's output reaches the console, without a rank prefix.
    assert len(header) == 1, r.stdout
    assert "3 ranks" in r.stdout
    cols = header[0].lstrip("#").split()
    rows = _rows(r.stdout)
    assert [int(row[0]) for row in rows] == [4096, 8192, 16384], r.stdout
    assert all(row[cols.index("#wrong")] == "0" for row in rows), r.stdout
    assert "mltrain: bench: 3 ranks succeeded" in r.stderr


def test_bench_defaults_to_two_ranks_and_records_the_run(ml):
    r = ml("bench", "-b", "4K", "-e", "4K", "--iters", "1", "--warmup", "0", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert [(l["ranks"], l["size"], l["op"]) for l in lines] == [(2, 4096, "allreduce")]
    runs = ml.run_dirs()
    assert len(runs) == 1 and "-bench-" in runs[0].name, runs
    rec = json.loads((runs[0] / "run.json").read_text())
    assert rec["status"] == "succeeded" and rec["workdir"] == "/"
    # The ranks ran the benchmark the agent delivered, not the launcher's binary.
    assert rec["argv"][:2] == ["/bin/sh", "-c"] and "/bin/mltrain-comm-bench" in rec["argv"][2], rec["argv"]


def test_bench_with_a_missing_spec_is_a_usage_error(ml):
    r = ml("bench", "nope.toml")
    assert r.returncode == 2
    assert "nope.toml: cannot read job spec" in r.stderr
    assert ml.run_dirs() == []


def test_bench_ps_mode_through_the_agents_servers(ml):
    # --mode ps: the workers push_pull through the parameter servers the local agent runs, beside
    # an allreduce of the same bytes; --check verifies every result.
    r = ml("bench", "-n", "2", "--mode", "ps", "--servers", "1", "-b", "4K", "-e", "64K", "-f", "4",
           "--iters", "2", "--warmup", "1", "--check", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--mode ps: 2 workers" in r.stdout, r.stdout
    header = [l for l in r.stdout.splitlines() if l.startswith("#") and "#wrong" in l]
    assert len(header) == 1 and header[0].split()[-1] == "#wrong", r.stdout
    rows = _rows(r.stdout)
    assert [(int(row[0]), int(row[1])) for row in rows] == [(4096, 1), (16384, 1), (65536, 1)], r.stdout
    assert all(row[-1] == "0" for row in rows), r.stdout
    assert "mltrain: bench: 2 ranks succeeded" in r.stderr


# bench says its algorithm in words, ends with nccl-tests' average line, and takes --env/-x.
def bench_rows(stdout):
    return [ln.split() for ln in stdout.splitlines() if ln.strip() and not ln.startswith("#")]


def test_bench_says_its_algorithm_in_words_and_ends_with_the_average_bus_bandwidth(ml):
    r = ml("bench", "-n", "4", "-b", "64K", "-e", "256K", "--check", timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "large allreduce: direct" not in r.stdout, r.stdout
    assert ("# allreduce of messages over 64K: each rank combines one slice of all the inputs, in one "
            "shared-memory segment (all ranks on one host)") in lines, r.stdout
    rows = bench_rows(r.stdout)
    assert [int(row[0]) for row in rows] == [65536, 131072, 262144], r.stdout
    cols = next(ln for ln in lines if ln.startswith("#") and "#wrong" in ln).lstrip("#").split()
    busbw = [float(row[cols.index("busbw")]) for row in rows]
    # The closing lines as nccl-tests prints them, the average over the sizes.
    assert lines[-3:-1] == ["# Out of bounds values : 0 OK", lines[-2]] and lines[-1] == "#", r.stdout
    m = re.fullmatch(r"# Avg bus bandwidth    : (\d+\.\d{3})", lines[-2])
    assert m, lines[-2]
    assert abs(float(m.group(1)) - sum(busbw) / len(busbw)) < 0.002, (m.group(1), busbw)
    # Why another algorithm: said too.
    r = ml("bench", "-n", "3", "-b", "64K", "-e", "64K", env={"MLTRAIN_COMM_ALGO": "hd"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert ("one ring, each rank passing a slice to the next (MLTRAIN_COMM_ALGO=hd does not apply: it needs "
            "a power-of-two number of ranks)") in r.stdout, r.stdout
    assert "# Out of bounds" not in r.stdout and "# Avg bus bandwidth    : " in r.stdout, r.stdout


def test_bench_takes_env_and_x_for_its_ranks(ml):
    r = ml("bench", "-n", "2", "-b", "64K", "-e", "64K", "--env", "MLTRAIN_COMM_ALGO=ring",
           "-x", "BENCH_FWD", "-x", "BENCH_SET=2", env={"BENCH_FWD": "fwd-1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "(MLTRAIN_COMM_ALGO=ring)" in r.stdout, r.stdout  # the ranks had it
    assert [int(row[0]) for row in bench_rows(r.stdout)] == [65536], r.stdout  # -e is still --maxbytes
    env = json.loads(ml("show", "--json").stdout)["ranks"][1]["env"]
    assert env["BENCH_FWD"] == "fwd-1" and env["BENCH_SET"] == "2" and env["MLTRAIN_COMM_ALGO"] == "ring", env
    r = ml("bench", "-n", "2", "-x", "BENCH_UNSET_XYZ", unset=("BENCH_UNSET_XYZ",), timeout=60)
    assert r.returncode == 2 and "BENCH_UNSET_XYZ is not set in this environment" in r.stderr, r.stderr
    r = ml("bench", "-n", "2", "--env", "NOEQUALS", timeout=60)
    assert r.returncode == 2 and "--env 'NOEQUALS' is not K=V" in r.stderr, r.stderr
    assert "--env" in ml("bench", "--help").stdout
