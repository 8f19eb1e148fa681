"""Messages a user can act on (issue 31, items 10 and 14): every bad value gets one clear line and
exit 2, never "internal error", a wrong flag name, a guess or a hang."""
import json
import os

import pytest

PY = "/usr/bin/python3"
BIG = "99999999999999999999"
I32 = 2147483647


def usage_error(r, *wanted):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "internal error" not in r.stderr and "unknown flag" not in r.stderr, r.stderr
    for w in wanted:
        assert w in r.stderr, r.stderr


def test_cp_with_a_rank_out_of_range_is_a_usage_error(ml):
    r = ml("cp", f"latest:{BIG}:x", str(ml.dir / "dest"))
    usage_error(r, f"the rank in RUN:RANK:PATH: '{BIG}' is out of range (a whole number from 0 to {I32})")


# Every integer flag of the CLI: one message for a value out of range or not a number.
INT_FLAGS = [
    (["logs"], "--tail", 0, I32),
    (["logs"], "-t", 0, I32),
    (["gc"], "--keep", 0, I32),
    (["run", "--dry-run"], "--nprocs", 1, 1 << 20),
    (["run", "--dry-run"], "--procs-per-host", 1, 4096),
    (["run", "--dry-run"], "--max-restarts", 0, 1000),
    (["run", "--dry-run"], "--master-port", 1, 65535),
    (["run", "--dry-run"], "--stdin-rank", 0, 1 << 20),
    (["bench"], "--iters", 1, 100000),
    (["bench"], "--warmup", 0, 100000),
    (["ssh"], "--rank", 0, I32),
    (["sbatch", "job.toml"], "--nodes", 1, 4096),
]


def given(flag, value):
    return [f"{flag}={value}"] if flag.startswith("--") else [flag, value]


@pytest.mark.parametrize("verb,flag,lo,hi", INT_FLAGS, ids=[f"{v[0]}{f}" for v, f, _, _ in INT_FLAGS])
def test_an_integer_flag_names_its_range(ml, verb, flag, lo, hi):
    long = {"-t": "--tail"}.get(flag, flag)
    tail = ["--", "true"] if verb[0] == "run" else []
    for value, what in [(BIG, "is out of range (a whole number from"), (str(hi + 1), "is out of range"),
                        ("abc", "is not a whole number (from"), ("1.5", "is not a whole number")]:
        r = ml(*verb, *given(flag, value), *tail)
        usage_error(r, f"{long}: '{value}' {what}", f"{lo} to {hi}")
    if lo > 0:
        r = ml(*verb, *given(flag, str(lo - 1)), *tail)
        usage_error(r, f"{long}: '{lo - 1}' is out of range")


def test_show_with_an_empty_run_id_is_an_error(ml):
    assert ml("run", "-n", "1", "--", "true").returncode == 0
    for verb in ("show", "logs", "stop", "rm"):
        r = ml(verb, "")
        usage_error(r, "an empty run id names no run")
    assert ml("show", "latest").returncode == 0  # the run is still there


def test_allgather_into_an_output_of_another_dtype_says_so(ml):
    """As a user meets it: two ranks, numpy arrays, the package the agent delivers."""
    script = ("import mltrain, numpy as np\n"
              "c = mltrain.init()\n"
              "for name, call in (('allgather', lambda: c.allgather(np.ones(4, np.float32), out=np.zeros(8))),\n"
              "                   ('reduce_scatter', lambda: c.reduce_scatter(np.ones(8, np.float32), out=np.zeros(4)))):\n"
              "    try:\n"
              "        call()\n"
              "    except ValueError as e:\n"
              "        print('ERR', e, flush=True)\n")
    r = ml("run", "-n", "2", "--", PY, "-c", script, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ERR allgather: the output is float64 and the input float32" in r.stdout, r.stdout
    assert "ERR reduce_scatter: the output is float64 and the input float32" in r.stdout, r.stdout
    assert "needs 8 elements" not in r.stdout


# --- bench: nccl-tests' -b/-e/-f, never a hang (item 10) -----------------------------------------

def test_bench_with_zero_sizes_runs_one_row_and_ends(ml):
    r = ml("bench", "-n", "2", "-b", "0", "-e", "0", "--iters", "2", "--warmup", "0", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [(x["size"], x["count"]) for x in rows] == [(0, 0)], r.stdout
    r = ml("bench", "-n", "2", "-b", "0", "-e", "16", "--iters", "1", "--warmup", "0", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [x["size"] for x in rows] == [0, 4, 8, 16], r.stdout


@pytest.mark.parametrize("args,wanted", [
    (["-b", "8K", "-e", "4K"], "-b 8K is more than -e 4K"),
    (["-f", "1"], "-f '1' is not a number over 1"),
    (["-f", "0"], "-f '0' is not a number over 1"),
    (["-f", "nan"], "-f 'nan' is not a number over 1"),
    (["-f", "1.0001"], "makes more than 1000 sizes"),
    (["-b", "x"], "-b: 'x' is not a size"),
    (["-e", BIG + "G"], "is not a size"),
    (["-n", "0"], "--nprocs: '0' is out of range"),
    (["-n", BIG], f"--nprocs: '{BIG}' is out of range"),
    (["--iters", "0"], "--iters: '0' is out of range"),
    (["--warmup", "-1"], "--warmup: '-1' is out of range"),
], ids=["b-over-e", "f-1", "f-0", "f-nan", "too-many-rows", "b-junk", "e-huge", "n-0", "n-huge", "iters-0",
        "warmup-negative"])
def test_bench_refuses_degenerate_values_before_starting(ml, args, wanted):
    r = ml("bench", *args, timeout=30)
    usage_error(r, wanted)
    assert not ml.run_dirs(), "nothing started"


# Sbatch: slots per host, its error's lines.
def test_sbatch_keeps_the_hosts_slots_and_refuses_uneven_ones(ml):
    spec = ml.write("slots.toml", '[run]\ncommand = "true"\n[cluster]\nhosts = ["h1:2", "h2:2", "h3:2", "h4:2"]\n')
    r = ml("sbatch", spec, "--print")
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --nodes=4" in r.stdout and "#SBATCH --ntasks-per-node=2" in r.stdout, r.stdout
    uneven = ml.write("uneven.toml", '[run]\ncommand = "true"\n[cluster]\nhosts = ["h1:2", "h2:1"]\n')
    r = ml("sbatch", uneven, "--print")
    assert r.returncode == 2 and "h1:2, h2:1" in r.stderr and "procs_per_host" in r.stderr, r.stderr


def test_sbatch_refusal_prints_its_lines_as_lines(ml):
    bindir = ml.dir / "bin"
    bindir.mkdir()
    fake = bindir / "sbatch"
    fake.write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed:'\n"
                    "echo 'Requested node configuration is not available'\nexit 1\n")
    fake.chmod(0o755)
    spec = ml.write("job.toml", '[run]\ncommand = "true"\n')
    r = ml("sbatch", spec, "--nodes", "2", env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    assert r.returncode == 255, r.stderr
    assert "\\x0a" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert any(ln.strip() == "Requested node configuration is not available" for ln in lines), r.stderr
