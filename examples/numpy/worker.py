"""A numpy-only worker: linear regression by data-parallel gradient descent, with mltrain's
collectives and nothing else (no torch, nothing installed: `mltrain run` delivers the package).

    mltrain run examples/numpy.toml
    mltrain run -n 4 -- /usr/bin/python3 examples/numpy/worker.py

Each rank holds its own shard of the data; every step the ranks average their gradients with one
allreduce (in place, no copy), so they all take the same step and end with the same weights.
"""
import hashlib

import numpy as np

import mltrain


def main():
    comm = mltrain.init()
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(1234 + rank)  # this rank's shard
    true_w = np.linspace(-1.0, 1.0, 16)
    x = rng.standard_normal((512, 16))
    y = x @ true_w + 0.01 * rng.standard_normal(512)

    w = np.zeros(16)
    mltrain.broadcast(w, root=0)  # every rank starts from rank 0's weights
    for step in range(200):
        grad = 2.0 * x.T @ (x @ w - y) / len(y)
        mltrain.allreduce(grad, "avg")
        w -= 0.05 * grad
        if step % 50 == 0 or step == 199:
            loss = np.array([np.mean((x @ w - y) ** 2)])
            mltrain.allreduce(loss, "avg")
            if rank == 0:
                print(f"step {step} loss {loss[0]:.6f} (mean over {size} ranks)", flush=True)

    # Rank 0 gathers every rank's digest of its weights: they must all be the same.
    digest = np.frombuffer(hashlib.sha256(w.tobytes()).digest()[:8], dtype=np.uint8).copy()
    digests = mltrain.allgather(digest).reshape(size, 8)
    if rank == 0:
        same = all((d == digests[0]).all() for d in digests)
        print(f"weights {'identical' if same else 'DIFFERENT'} on all {size} ranks; "
              f"max |w - true_w| = {np.abs(w - true_w).max():.4f}", flush=True)
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
