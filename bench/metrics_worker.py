"""bench/metrics_worker.py: one rank of bench/metrics.py's training loop (see there)."""
import json
import os
import sys
import time

import numpy as np

import mltrain

mode, steps = sys.argv[1], int(sys.argv[2])
BLOCK = 250  # mode ab: rank 0 logs in every other block of this many steps
mltrain.init()
rank = mltrain.rank()
grad = np.ones(1 << 14, np.float32)
w = np.random.default_rng(rank).standard_normal((96, 96)).astype(np.float32)
in_log = 0.0
blocks = {True: [], False: []}  # mode ab: each block's seconds, logging or not
mltrain.barrier()
t0 = block_t0 = time.perf_counter()
for step in range(steps):
    if mode == "ab" and step % BLOCK == 0 and step:
        now = time.perf_counter()
        blocks[(step // BLOCK - 1) % 2 == 1].append(now - block_t0)
        block_t0 = now
    w = np.tanh(w @ w.T * 0.01)               # the step's compute
    mltrain.allreduce(grad)                    # and its gradient exchange
    grad.fill(1.0)
    if rank != 0:
        continue
    loss = 1.0 / (step + 1)
    if mode == "log" or (mode == "ab" and (step // BLOCK) % 2 == 1):
        a = time.perf_counter()
        mltrain.log(step=step, loss=loss, lr=0.1)
        in_log += time.perf_counter() - a
    elif mode in ("print", "pattern"):
        print(f"step {step} loss={loss:.6f}", flush=True)
mltrain.barrier()
elapsed = time.perf_counter() - t0
if rank == 0:
    sys.stderr.write("RESULT " + json.dumps({"step_us": elapsed / steps * 1e6, "in_log_s": in_log,
                                             "elapsed_s": elapsed, "on": blocks[True],
                                             "off": blocks[False]}) + "\n")
