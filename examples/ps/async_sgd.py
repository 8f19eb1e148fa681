"""Asynchronous parameter-server training of a model held on the servers (numpy only: runs
anywhere `mltrain run` does).

    mltrain run examples/ps/async_sgd.toml

The model is a linear regression y = X w with a known solution w*: every worker has its own shard
of (X, y), noise-free, so every shard's least-squares solution is w*. The weights live on the
parameter servers ([ps] sync = false): a worker pulls the latest w, computes the gradient of its
shard's mean squared error, and pushes it; the server-side optimizer ([ps.optimizer], sgd) applies
each push at once: w -= lr * (momentum buffer of the gradients). No worker waits for another.

At the end every worker pulls w and prints its largest distance to w*; worker 0 exits non-zero when
it is above --tol (1e-3).
"""
import argparse
import sys

import numpy as np

import mltrain.ps as ps


def true_w(dim):
    return np.linspace(-1.0, 1.0, dim, dtype=np.float32)


def shard(worker, dim, rows):
    """Worker's own data: its own rows of X (a seed per worker), y = X w* exactly."""
    x = np.random.default_rng(1000 + worker).standard_normal((rows, dim)).astype(np.float32)
    return x, x @ true_w(dim)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300, help="pushes per worker")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--rows", type=int, default=256, help="rows of each worker's shard")
    p.add_argument("--tol", type=float, default=1e-3)
    args = p.parse_args()

    ps.init()  # MLTRAIN_PS_SERVERS, RANK, WORLD_SIZE, MLTRAIN_TOKEN from `mltrain run`
    me, n = ps.worker(), ps.num_workers()
    if ps.is_sync():
        sys.exit("async_sgd.py: the servers are sync; run it with [ps] sync = false and an "
                 "[ps.optimizer] (examples/ps/async_sgd.toml)")
    x, y = shard(me, args.dim, args.rows)

    w = np.zeros(args.dim, np.float32)
    ps.declare("w", w)  # zeros on the servers (every worker declares; the first one's value wins)
    grad = np.empty_like(w)
    for step in range(args.steps):
        ps.pull("w", w)                                  # the latest weights
        np.matmul(x.T, x @ w - y, out=grad)
        grad *= 2.0 / args.rows                          # d/dw of mean((x w - y)^2)
        ps.push("w", grad)                               # applied at once by the server's sgd
        if step % 100 == 0:
            loss = float(np.mean((x @ w - y) ** 2))
            print(f"worker {me}/{n} step {step} loss {loss:.3e}", flush=True)

    ps.pull("w", w)
    err = float(np.abs(w - true_w(args.dim)).max())
    print(f"worker {me}: max |w - w*| = {err:.3e} after {args.steps} pushes from each of {n} workers",
          flush=True)
    ps.shutdown()
    if me == 0 and not err <= args.tol:
        print(f"worker 0: did not converge: {err:.3e} > {args.tol:g}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
