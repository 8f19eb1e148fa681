#!/usr/bin/python3
"""bench/metrics_read.py: what reading a run's metrics costs `show`, `diff` and `ls` (docs/metrics.md).

Makes two runs whose rank reports 3 metrics (loss, acc, lr) for STEPS steps (1,300,000: a
metrics.jsonl of about 116 MB), then times each command ROUNDS (5) times, interleaved with its
peer: the same command on a copy of the runs without their summaries (metrics-summary.json,
metrics-series.json), which reads all of metrics.jsonl as mltrain did before it kept them. The
table shows medians of wall time and peak RSS and the ratio of the two times. Checks that both
ways print the same first/min/last line for every metric; exits 1 when not or when a command fails.
Never fails on speed.

    bench/metrics_read.py
    ROUNDS=3 STEPS=300000 MLTRAIN_BIN=/path/to/mltrain bench/metrics_read.py
"""
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = os.environ.get("MLTRAIN_BIN", str(ROOT / "build" / "mltrain"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
STEPS = int(os.environ.get("STEPS", "1300000"))

FLOOD = """
import math, os, sys
n = int(sys.argv[1])
with os.fdopen(3, "w", buffering=1 << 16) as f:
    for i in range(n):
        f.write('{"step": %d, "loss": %.10g, "acc": %.6f, "lr": 0.001}\\n'
                % (i, 1.0 / (1 + i) + 0.01 * math.sin(i), i / n))
"""

PEAK = """
import resource, subprocess, sys, time
t = time.monotonic()
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE)
sys.stdout.buffer.write(r.stdout)
print(time.monotonic() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(r.returncode)
"""


def timed(env, *args):
    r = subprocess.run([sys.executable, "-c", PEAK, BIN, *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"metrics_read: mltrain {' '.join(args)} failed: {r.stderr[-2000:]}")
    wall, kib = r.stderr.split()[-2:]
    return r.stdout, float(wall), int(kib) / 1024


def main():
    work = Path(tempfile.mkdtemp(prefix="mltrain-metrics-read."))
    try:
        (work / "flood.py").write_text(FLOOD)
        env = dict(os.environ, MLTRAIN_HOME=str(work / "home"), XDG_STATE_HOME=str(work / "state"), LC_ALL="C")
        for name in ("a", "b"):
            subprocess.run([BIN, "run", "--name", name, "--workdir", str(work), "--",
                            "/usr/bin/python3", "flood.py", str(STEPS)], env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        runs = sorted(p for p in (work / "home" / "runs").iterdir() if p.is_dir())
        size = (runs[0] / "metrics.jsonl").stat().st_size
        # The peer: the same runs with no summary beside metrics.jsonl.
        bare_env = dict(env, MLTRAIN_HOME=str(work / "bare"))
        shutil.copytree(work / "home", work / "bare", symlinks=True)
        for run in (work / "bare" / "runs").iterdir():
            for f in ("metrics-summary.json", "metrics-series.json"):
                (run / f).unlink(missing_ok=True)
        a, b = (r.name for r in runs)
        commands = {"show": ["show", a], "diff": ["diff", a, b],
                    "ls --where": ["ls", "--where", "metric.loss < 1", "--columns", "name,metric.loss.min"]}
        rows = {k: {"summary": [], "whole file": []} for k in commands}
        for _ in range(ROUNDS):
            for cmd, args in commands.items():
                out_s, t_s, m_s = timed(env, *args)
                out_w, t_w, m_w = timed(bare_env, *args)
                if cmd == "show":
                    stats = lambda out: re.findall(r"^\w+: first .*$", out, re.M)
                    if stats(out_s) != stats(out_w) or len(stats(out_s)) != 3:
                        sys.exit(f"metrics_read: show differs:\n{stats(out_s)}\n{stats(out_w)}")
                rows[cmd]["summary"].append((t_s, m_s))
                rows[cmd]["whole file"].append((t_w, m_w))
        print(f"reading metrics, median of {ROUNDS} interleaved rounds ({STEPS} steps x 3 metrics, "
              f"metrics.jsonl {size / 1e6:.0f} MB, 2 runs)")
        print(f"{'command':<12} {'way':<11} {'wall_s':>8} {'peak_RSS_MiB':>13} {'x_whole_file':>13}")
        for cmd, ways in rows.items():
            med = {w: (statistics.median(t for t, _ in v), statistics.median(m for _, m in v)) for w, v in ways.items()}
            for w, (t, m) in med.items():
                ratio = f"{med['whole file'][0] / t:.1f}" if w == "summary" else "1.0"
                print(f"{cmd:<12} {w:<11} {t:8.3f} {m:13.1f} {ratio:>13}")
        print("x_whole_file: how many times faster than reading all of metrics.jsonl")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
