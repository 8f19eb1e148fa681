"""A stand-in for training that `mltrain sweep` tunes (examples/sweep/sweep.toml): its loss falls
with lr * batch, and diverges when that product passes 2 (lr 0.1 with batch 32), the trial that
median stopping ends early. It logs through mltrain.log, no init needed."""
import argparse
import time

import mltrain

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--batch", type=int, required=True)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--step-seconds", type=float, default=0.05)
a = p.parse_args()

rate = a.lr * a.batch
for step in range(a.steps):
    loss = 1.0 + 0.1 * step if rate > 2 else 1.0 / (1.0 + rate * step)
    mltrain.log(step=step, loss=loss, lr=a.lr)
    time.sleep(a.step_seconds)
print(f"lr={a.lr} batch={a.batch}: final loss {loss:.4f}")
