#!/usr/bin/python3
"""bench/ddp_step.py: DDP training steps per second with gloo versus the mltrain hook.

The same stock DDP job (bench/ddp_step_worker.py: 8 x Linear(2048, 2048), batch 8, SGD; 134 MB of
gradients a step) runs with DDP's own gloo allreduce and with
`ddp.register_comm_hook(None, mltrain.torch.allreduce_hook)`, and with no communication at all
("none": a hook that returns the bucket as it is, the floor of any transport: DDP's own copies
stay), ROUNDS (7) times each, interleaved, the order rotated every round. Each run reports the median step time over STEPS steps (after
WARMUP) and the median of the same step under ddp.no_sync() (compute alone); the table shows the
median over rounds, steps/s, the share of the step spent in communication the step could not
hide ((step - compute) / step), and the ratio mltrain/gloo in every round so the spread shows.

    bench/ddp_step.py                          # 4 ranks on this host
    bench/ddp_step.py --cluster                # 4 ranks, one on each test-cluster host
    ROUNDS=3 STEPS=6 bench/ddp_step.py
    BUCKET_VIEW=0 bench/ddp_step.py            # DDP's defaults only
    VARIANTS="mltrain:MLTRAIN_COMM_ALGO=ring" bench/ddp_step.py   # more rows: the hook with knobs

The three run twice: with DDP's defaults, and with gradient_as_bucket_view=True (rows
":DDP_STEP_BUCKET_VIEW=1"; PyTorch's setting that spares DDP its copies between gradients and
buckets), each setting against gloo with the same setting. BUCKET_VIEW=0 leaves the second out.
VARIANTS adds rows: a comm (gloo, mltrain, none) run with the given KEY=VALUE settings
(colon-separated) in the ranks' environment, interleaved with the others.
"mltrain:DDP_STEP_HOOK=sync" is the hook's
synchronization alone (a one-element allreduce per bucket, the bucket handed back as it is): what
waiting for the other ranks costs, apart from moving and reducing the data.

--cluster needs root and the test cluster (tests/cluster/up.sh -n 4; brought up when it is not);
its ranks run as the cluster's login user from a copy of the worker in a world-readable folder.
Never fails on speed; exits 1 when a run fails.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = os.environ.get("MLTRAIN_BIN", str(ROOT / "build" / "mltrain"))
ROUNDS = int(os.environ.get("ROUNDS", "7"))
STEPS = int(os.environ.get("STEPS", "10"))
WARMUP = int(os.environ.get("WARMUP", "2"))
CLUSTER_DIR = os.environ.get("MLTRAIN_CLUSTER_DIR", "/tmp/mltrain-cluster")


def run_one(peer, where, work, home):
    comm, *knobs = peer.split(":")  # "mltrain:KEY=VALUE:...": knobs in the ranks' environment
    worker = work / "ddp_step_worker.py"
    cmd = [BIN, "run", "--name", f"ddp-step-{comm}", "--env", "OMP_NUM_THREADS=1", "--env", "OPENBLAS_NUM_THREADS=1"]
    for k in knobs:
        cmd += ["--env", k]
    if where == "cluster":
        hostfile = work / "hostfile"
        cmd += ["--hostfile", str(hostfile), "--ssh-config", f"{CLUSTER_DIR}/ssh_config", "--workdir", "/tmp"]
    else:
        cmd += ["-n", "4"]
    cmd += ["--", "/usr/bin/python3", str(worker), "--comm", comm, "--steps", str(STEPS),
            "--warmup", str(WARMUP)]
    env = dict(os.environ, MLTRAIN_HOME=str(home))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in p.stdout.splitlines():
        if "DDP-STEP " in line:
            return json.loads(line.split("DDP-STEP ", 1)[1])
    sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
    sys.exit(f"ddp_step: the {comm} run failed (exit {p.returncode})")


def main():
    where = "cluster" if "--cluster" in sys.argv[1:] else "local"
    work = Path(tempfile.mkdtemp(prefix="mltrain-ddp-step-", dir="/tmp"))
    work.chmod(0o755)
    home = work / "home"
    try:
        shutil.copy2(ROOT / "bench" / "ddp_step_worker.py", work / "ddp_step_worker.py")
        (work / "ddp_step_worker.py").chmod(0o644)
        if where == "cluster":
            up = Path(f"{CLUSTER_DIR}/ssh_config").exists() and all(
                subprocess.run(["ip", "netns", "exec", f"mlt-h{k}", "true"], capture_output=True).returncode == 0
                for k in range(1, 5))
            if not up:
                subprocess.run([str(ROOT / "tests/cluster/up.sh"), "-n", "4"], check=True,
                               stdout=subprocess.DEVNULL)
            (work / "hostfile").write_text("h1 slots=1\nh2 slots=1\nh3 slots=1\nh4 slots=1\n")
        peers = ["gloo", "mltrain", "none"]
        if os.environ.get("BUCKET_VIEW", "1") != "0":
            peers += [c + ":DDP_STEP_BUCKET_VIEW=1" for c in peers]
        peers += [v for v in os.environ.get("VARIANTS", "").split() if v]
        runs = {c: [] for c in peers}
        run_one("mltrain", where, work, home)  # untimed: the agent copy, cold caches
        for r in range(ROUNDS):
            order = peers[r % len(peers):] + peers[:r % len(peers)]
            for c in order:
                runs[c].append(run_one(c, where, work, home))
                print(f"# round {r + 1}/{ROUNDS} {c}: step {runs[c][-1]['step_s'] * 1e3:.1f} ms", file=sys.stderr)
        grad_mb = runs["gloo"][0]["grad_bytes"] / 1e6
        what = "4 ranks, one per test-cluster host" if where == "cluster" else "4 ranks on this host"
        print(f"DDP steps, {what}: 8 x Linear(2048,2048), batch 8, {grad_mb:.0f} MB of gradients a step; "
              f"median of {ROUNDS} interleaved rounds x {STEPS} steps")
        w = max(10, max(len(c) for c in peers) + 2)
        print(f"{'comm':<{w}}{'step_ms':>10}{'steps/s':>10}{'compute_ms':>12}{'comm_share':>12}")
        med = {}
        for c in peers:
            step = statistics.median(x["step_s"] for x in runs[c])
            comp = statistics.median(x["compute_s"] for x in runs[c])
            med[c] = step
            share = max(0.0, (step - comp) / step)
            print(f"{c:<{w}}{step * 1e3:>10.1f}{1 / step:>10.2f}{comp * 1e3:>12.1f}{share * 100:>11.0f}%")
        # A row with knobs against gloo with the same knobs (the hook's own aside), when that
        # row runs too.
        def knobs(c):
            return ":".join(k for k in c.split(":")[1:] if not k.startswith("DDP_STEP_HOOK="))

        def base(c):
            g = "gloo:" + knobs(c) if knobs(c) else "gloo"
            return g if g in runs else "gloo"
        for c in peers:
            if c == base(c):
                continue
            g = base(c)
            per_round = [a["step_s"] / m["step_s"] for a, m in zip(runs[g], runs[c])]
            what = " (no communication: the most any transport can reach)" if c.startswith("none") else ""
            print(f"{c} = {med[g] / med[c]:.2f} x {g} steps/s{what} "
                  f"(per round: {' '.join(f'{x:.2f}' for x in per_round)})")
        for c in peers:
            floor = "none:" + knobs(c) if knobs(c) else "none"
            if c.startswith("mltrain") and floor in med:
                print(f"{c}'s step takes {med[c] / med[floor]:.2f} x {floor}'s (no communication)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
