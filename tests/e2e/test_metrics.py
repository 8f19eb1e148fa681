"""Metrics (docs/metrics.md): mltrain.log from the ranks and [metrics] patterns on rank 0's
output land in metrics.jsonl; `show` charts them, `show --json` and `diff` carry them; what a rank
sends through its metrics pipe is bounded like everything a host sends."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import SANITIZED

TRAIN = """
import os, sys, mltrain
rank = int(os.environ["RANK"])
scale = float(sys.argv[1])
for step in range(200):
    loss = scale / (step + 1)
    if rank == 0:
        mltrain.log(step=step, loss=loss, lr=0.1)
        print(f"it {step} acc={step / 200:.3f}", flush=True)
    else:
        mltrain.log(loss=loss * 10)          # no step: 0, 1, 2, ...
"""


def job(ml, scale, name="curve"):
    (ml.dir / "train.py").write_text(TRAIN)
    spec = ml.dir / f"{name}.toml"
    spec.write_text(
        f'name = "{name}"\n[run]\nargv = ["/usr/bin/python3", "train.py", "{scale}"]\n'
        f'workdir = "{ml.dir}"\n[cluster]\nnprocs = 2\n'
        "[metrics]\npattern = 'it (?P<step>\\d+) acc=(?P<acc>[0-9.]+)'\n")
    return spec


def test_log_and_pattern_land_in_metrics_jsonl_and_show_charts_them(ml):
    r = ml("run", job(ml, 1.0), timeout=60)
    assert r.returncode == 0, r.stderr
    run = ml.run_dirs()[-1]
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    rank0 = [l for l in lines if l["rank"] == 0 and "loss" in l]
    assert [l["step"] for l in rank0] == list(range(200))
    assert rank0[9]["loss"] == 0.1 and rank0[9]["lr"] == 0.1
    rank1 = [l for l in lines if l["rank"] == 1]
    assert [l["step"] for l in rank1] == list(range(200)) and rank1[0]["loss"] == 10.0
    acc = [l for l in lines if "acc" in l]
    assert len(acc) == 200 and acc[-1]["step"] == 199 and acc[-1]["acc"] == 0.995
    record = json.loads((run / "run.json").read_text())
    # Names in the order they first came: the pipe's and the pattern's race.
    assert sorted(record["metrics"]["names"]) == ["acc", "loss", "lr"]
    assert record["metrics"]["records"] == 600 and record["metrics"]["dropped"] == 0

    show = ml("show", run.name, env={"LC_ALL": "C"})
    assert show.returncode == 0, show.stderr
    out = show.stdout
    assert "loss: first 1, min 0.005 at step 199, last 0.005 at step 199 (200 steps)" in out, out
    assert "acc: first 0, min 0 at step 0, last 0.995 at step 199 (200 steps)" in out, out
    chart = out[out.index("loss: first"):].splitlines()[:11]
    assert re.match(r" +1 [|]\*", chart[1]) and re.match(r" +[+]-{60}$", chart[9]), chart
    assert chart[10].strip() == "step 0" + " " * 51 + "199", chart
    assert "⠀" not in out and "┤" not in out  # no UTF-8 where the locale has none
    assert "┤" in ml("show", run.name).stdout  # braille with a UTF-8 locale

    doc = json.loads(ml("show", run.name, "--json").stdout)
    loss = doc["metric_series"]["loss"]
    assert loss["rank"] == 0 and loss["count"] == 200 and loss["last"] == 0.005 and loss["min_step"] == 199
    assert loss["steps"][:3] == [0, 1, 2] and loss["values"][1] == 0.5
    assert sorted(doc["metrics"]["names"]) == ["acc", "loss", "lr"]


def test_diff_compares_the_metrics_of_two_runs(ml):
    ids = []
    for scale in (1.0, 4.0):
        before = set(ml.run_dirs())
        assert ml("run", job(ml, scale), timeout=60).returncode == 0
        ids += [d.name for d in set(ml.run_dirs()) - before]
    a, b = ids
    d = ml("diff", a, b, env={"LC_ALL": "C"})
    assert d.returncode == 0, d.stderr
    assert "* loss      0.005 / 0.005            0.02 / 0.02" in d.stdout, d.stdout
    assert "  acc       0.995 / 0                0.995 / 0" in d.stdout, d.stdout
    assert "loss: A *, B o" in d.stdout
    doc = json.loads(ml("diff", a, b, "--json").stdout)
    assert doc["metrics"]["loss"]["a"]["final"] == 0.005 and doc["metrics"]["loss"]["b"]["final"] == 0.02
    assert doc["metrics"]["lr"]["a"]["min"] == 0.1 and doc["metrics"]["acc"]["b"]["count"] == 200


def test_what_a_rank_writes_into_its_metrics_pipe_is_bounded_and_escaped(ml):
    # Raw writes to the pipe: junk, an overlong line, a name with an escape code, and good lines.
    (ml.dir / "flood.py").write_text(
        "import os\nfd = int(os.environ['MLTRAIN_METRICS_FD'])\n"
        "os.write(fd, b'junk\\n' * 1000 + b'{\"a\":\"' + b'x' * 100000 + b'\"}\\n')\n"
        "os.write(fd, b'{\"step\":1,\"\\\\u001b[31mred\":1,\"ok\":2}\\n{\"step\":2,\"ok\":1}\\n')\n"
        "print('done', flush=True)\n")
    r = ml("run", "--", "/usr/bin/python3", ml.dir / "flood.py", timeout=60)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    run = ml.run_dirs()[-1]
    assert [json.loads(l)["ok"] for l in (run / "metrics.jsonl").read_text().splitlines()] == [2, 1]
    record = json.loads((run / "run.json").read_text())
    assert record["metrics"] == {"names": ["ok"], "records": 2, "dropped": 1002}
    show = ml("show", run.name).stdout
    assert "ok: first 2, min 1 at step 2, last 1 at step 2 (2 steps)" in show
    assert "\x1b[31m" not in show and "1002 metric records or values were refused" in show


def test_log_outside_mltrain_run_does_nothing_and_a_step_must_be_a_count(ml):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLTRAIN_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "python")
    code = ("import mltrain\nmltrain.log(loss=1.0)\nmltrain.log(step=3, loss=0.5)\nmltrain.metrics.flush()\n"
            "try:\n    mltrain.log(step=-1, loss=1)\nexcept ValueError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == "mltrain.log: step must be >= 0, not -1\n"


FLOOD = """
import math, os, sys
n = int(sys.argv[1])
with os.fdopen(3, "w", buffering=1 << 16) as f:
    for i in range(n):
        f.write('{"step": %d, "loss": %.10g, "acc": %.6f, "lr": 0.001}\\n'
                % (i, 2.0 / (1 + i) + (5.0 if i == 7777 else 0.0), i / n))
"""


PEAK = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(rc)
"""


def peak_mib(ml, *args):
    """Runs `mltrain ARGS` and returns (its output, its peak resident memory in MiB)."""
    r = subprocess.run([sys.executable, "-c", PEAK, ml.bin, *map(str, args)], env=ml._env(),
                       cwd=str(ml.dir), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout, int(r.stderr.split()[-1]) / 1024


def test_show_ls_and_diff_of_large_metrics_read_the_summary_not_the_file(ml):
    """Issue 47 item 6: a 60 MB metrics.jsonl made show take 3 s and 170 MB (1.2 GB at 124 MB)."""
    (ml.dir / "flood.py").write_text(FLOOD)
    n = 700_000
    for name in ("big-a", "big-b"):
        r = ml("run", "--name", name, "--workdir", ml.dir, "--", sys.executable, "flood.py", n, timeout=120)
        assert r.returncode == 0, r.stderr
    a, b = ml.run_dirs()
    assert (a / "metrics.jsonl").stat().st_size > 50 << 20
    for args in (("show", a.name), ("show", "--json", a.name), ("diff", a.name, b.name),
                 ("ls", "--where", "metric.loss < 1", "--columns", "name,metric.loss.min,metric.loss.count")):
        out, peak = peak_mib(ml, *args)
        if not SANITIZED:
            assert peak < 100, f"mltrain {' '.join(args)} peaked at {peak:.0f} MiB"
        if args[0] == "show" and len(args) == 2:
            assert f"loss: first 2, min 2.85714e-06 at step {n - 1}, last 2.85714e-06 at step {n - 1} ({n} steps)" \
                in out, out
        if args[0] == "ls":
            assert out.count(f" {n}") == 2, out
    doc = json.loads(ml("show", "--json", a.name).stdout)
    loss = doc["metric_series"]["loss"]
    assert loss["count"] == n and abs(loss["max"] - (5 + 2 / 7778)) < 1e-9 and len(loss["steps"]) <= 1000
    assert 7777 in loss["steps"]  # the spike survives the thinning
