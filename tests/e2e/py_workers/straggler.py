"""A rank of the telemetry test: STEPS allreduces, rank SLOW sleeping DELAY seconds before each, so
every other rank waits inside the collective for it. Prints "STRAGGLER-DONE <rank>" at the end."""
import os
import time

import numpy as np

import mltrain

STEPS = int(os.environ.get("STEPS", "30"))
DELAY = float(os.environ.get("DELAY", "0.1"))
SLOW = int(os.environ.get("SLOW_RANK", "1"))

comm = mltrain.init()
x = np.ones(1024, dtype=np.float32)
for _ in range(STEPS):
    if comm.rank == SLOW:
        time.sleep(DELAY)
    y = mltrain.allreduce(x.copy())
    assert y[0] == comm.size
# Past the loop, so the agent samples the counters of a finished loop at least once.
time.sleep(0.5)
mltrain.barrier()
print(f"STRAGGLER-DONE {comm.rank}", flush=True)
