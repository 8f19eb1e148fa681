#!/usr/bin/python3
"""bench/metrics.py: what recording metrics costs a training loop (docs/metrics.md).

8 ranks on this host run one loop (bench/metrics_worker.py: a 96x96 matmul and an allreduce of 64
KiB through the comm library a step). Two comparisons, ROUNDS (5) rounds each, interleaved:

    log      one run of 2 x STEPS steps in blocks of 250, rank 0 calling mltrain.log(step=, loss=,
             lr=) every step of every other block: STEPS (10,000) logged steps. Its peer is the
             same run's blocks without it (each logging block against the block before it), so
             the two see the same machine; the run-to-run spread of 8 ranks on a shared host
             (10% and more) does not enter the ratio.
    pattern  rank 0 prints "step N loss=X" every step for STEPS steps, matched by a [metrics]
             pattern into metrics.jsonl; its peer is the same run without [metrics] ("print").
             The matching is the launcher's work, so this ratio carries the run-to-run spread.

The table shows each way's median step time and its ratio to its peer (the median of the rounds'
medians), and for `log` the share of the logging blocks spent inside mltrain.log calls, what the
training thread pays itself. Checks that every run's metrics.jsonl has every logged value; exits
1 when not or when a run fails. Never fails on speed.

    bench/metrics.py
    ROUNDS=3 STEPS=2000 bench/metrics.py
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = os.environ.get("MLTRAIN_BIN", str(ROOT / "build" / "mltrain"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
STEPS = int(os.environ.get("STEPS", "10000"))
RANKS = 8
WAYS = ["ab", "print", "pattern"]


def run_one(way, work):
    home = work / "home"
    spec = work / f"{way}.toml"
    mode = "print" if way == "pattern" else way
    steps = 2 * STEPS if way == "ab" else STEPS
    spec.write_text(
        f'name = "metrics-{way}"\n[run]\nargv = ["/usr/bin/python3", "{ROOT / "bench" / "metrics_worker.py"}", '
        f'"{mode}", "{steps}"]\nenv = {{ OMP_NUM_THREADS = "1", OPENBLAS_NUM_THREADS = "1" }}\n'
        f'[cluster]\nnprocs = {RANKS}\n'
        + ("[metrics]\npattern = 'step (?P<step>\\d+) loss=(?P<ploss>[-0-9.e+]+)'\n" if way == "pattern" else ""))
    env = dict(os.environ, MLTRAIN_HOME=str(home))
    before = set(home.glob("runs/*")) if home.exists() else set()
    p = subprocess.run([BIN, "run", str(spec)], env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"metrics: the {way} run failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    result = json.loads(p.stderr.split("RESULT ", 1)[1].splitlines()[0])
    (run,) = set(home.glob("runs/*")) - before
    want = {"ab": ["loss", "lr"], "pattern": ["ploss"]}.get(way, [])
    counts = {}
    metrics = run / "metrics.jsonl"
    for line in (metrics.read_text().splitlines() if metrics.exists() else []):
        for k in json.loads(line):
            counts[k] = counts.get(k, 0) + 1
    for name in want:
        if counts.get(name) != STEPS:
            sys.exit(f"metrics: the {way} run recorded {counts.get(name, 0)} of {STEPS} '{name}' values")
    return result


BLOCK = 250  # as bench/metrics_worker.py


def block_ratio(ab):
    """The median over a run's block pairs of (logging block) / (the block before it, without)."""
    return statistics.median(on / off for on, off in zip(ab["on"], ab["off"]))


def main():
    if not Path(BIN).is_file():
        sys.exit(f"metrics: {BIN} not found (cmake --build build -j2 --target mltrain)")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="mltrain-metrics-bench.") as tmp:
        work = Path(tmp)
        for r in range(ROUNDS):
            order = WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]
            rounds.append({way: run_one(way, work) for way in order})
            ab = rounds[-1]["ab"]
            print(f"round {r + 1}/{ROUNDS}: log {block_ratio(ab):.3f}x of its blocks without; pattern "
                  f"{rounds[-1]['pattern']['step_us'] / rounds[-1]['print']['step_us']:.3f}x of print",
                  file=sys.stderr)
    med = statistics.median
    print(f"{RANKS} ranks on this host, {STEPS} logged steps a run, {ROUNDS} rounds interleaved; medians")
    print(f"{'way':<8} {'step_us':>8} {'ratio':>8}  {'peer':<34} {'in log()':>8}")
    log_us = med(med(r["ab"]["on"]) / BLOCK * 1e6 for r in rounds)
    share = med(r["ab"]["in_log_s"] / (len(r["ab"]["on"]) + 1) / med(r["ab"]["on"]) for r in rounds) * 100
    print(f"{'log':<8} {log_us:>8.1f} {med(block_ratio(r['ab']) for r in rounds):>7.3f}x  "
          f"{'the same run without it, per block':<34} {share:>7.2f}%")
    print(f"{'print':<8} {med(r['print']['step_us'] for r in rounds):>8.1f} {'':>8}  {'':<34}")
    print(f"{'pattern':<8} {med(r['pattern']['step_us'] for r in rounds):>8.1f} "
          f"{med(r['pattern']['step_us'] / r['print']['step_us'] for r in rounds):>7.3f}x  {'print':<34}")


if __name__ == "__main__":
    main()
