"""A rank of the Python ops test: every collective x every dtype, on numpy arrays and on torch
tensors, blocking and async, checked against a reference each rank computes for every rank's input
(inputs are a function of the rank). Prints "OPS-OK <checks> <package file> <library>" at the
end; raises (exit 1) at the first wrong element, naming the case."""
import os
import sys

import numpy as np

import mltrain

try:
    import torch
except ImportError:  # numpy alone is still checked
    torch = None

COUNT = 1003  # odd: uneven ring chunks; * size for reduce_scatter inputs
NP_DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8"]
TORCH_DTYPES = NP_DTYPES + ["bfloat16"]
OPS = ["sum", "prod", "min", "max", "avg"]


def base(r, n, dtype):
    """Rank r's input as float64: small values (1..5, halved and shifted for floats), so sums stay
    exact in every integer type; products may wrap (compared modulo 2^bits)."""
    i = np.arange(n, dtype=np.float64)
    v = ((i * 7 + r * 13) % 5) + 1
    if dtype.startswith("float") or dtype == "bfloat16":
        v = v * 0.5 + (r % 3) * 0.25
    return v


def reduce_ref(op, inputs, dtype):
    a = np.stack(inputs)
    if op == "sum":
        return a.sum(0)
    if op == "prod":
        return a.prod(0)
    if op == "min":
        return a.min(0)
    if op == "max":
        return a.max(0)
    s = a.sum(0)
    if dtype.startswith("float") or dtype == "bfloat16":
        return s / len(inputs)
    return np.trunc(s / len(inputs))


def tolerance(dtype, op, size):
    u = {"float32": 2.0 ** -24, "float64": 2.0 ** -53, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}.get(dtype)
    if u is None:
        return 0.0
    return 4 * size * u  # relative; the library's bound is (n-1)u (docs/comm.md), rounding of the input too


class Arrays:
    """numpy or torch, behind one face: make from float64, read back as float64."""

    def __init__(self, kind):
        self.kind = kind

    def make(self, v, dtype):
        if self.kind == "numpy":
            return v.astype(dtype)
        return torch.from_numpy(v).to(getattr(torch, dtype))

    def f64(self, x):
        if self.kind == "numpy":
            return x.astype(np.float64)
        return x.to(torch.float64).numpy()

    def ptr(self, x):
        return x.__array_interface__["data"][0] if self.kind == "numpy" else x.data_ptr()

    def rounded(self, v, dtype):
        """v as the dtype holds it (the inputs' own rounding), then float64."""
        return self.f64(self.make(v, dtype))


def check(name, got, want, dtype, op, size):
    if dtype in ("int32", "int64", "uint8"):
        bits = {"int32": 32, "int64": 64, "uint8": 8}[dtype]
        if op in ("sum", "prod"):  # wrap modulo 2^bits, compared as unsigned residues
            want = np.mod(want, 2.0 ** bits)
            got = np.mod(got, 2.0 ** bits)
        bad = np.nonzero(got != want)[0]
    else:
        tol = tolerance(dtype, op, size)
        bad = np.nonzero(np.abs(got - want) > tol * np.maximum(np.abs(want), 1.0))[0]
    if bad.size:
        i = bad[0]
        raise AssertionError(f"{name}: element {i} is {got[i]!r}, expected {want[i]!r} "
                             f"({bad.size} wrong)")


def main():
    comm = mltrain.init()
    assert mltrain.is_initialized() and mltrain.rank() == comm.rank and mltrain.size() == comm.size
    assert comm.rank == int(os.environ["RANK"]) and comm.size == int(os.environ["WORLD_SIZE"])
    assert comm.local_rank == int(os.environ["LOCAL_RANK"])
    r, n = comm.rank, comm.size
    checks = 0
    kinds = ["numpy"] + (["torch"] if torch is not None else [])
    for kind in kinds:
        A = Arrays(kind)
        for dtype in (NP_DTYPES if kind == "numpy" else TORCH_DTYPES):
            inputs = [A.rounded(base(k, COUNT, dtype), dtype) for k in range(n)]
            for op in OPS:
                for mode in ("blocking", "async"):
                    x = A.make(base(r, COUNT, dtype), dtype)
                    p = A.ptr(x)
                    if mode == "blocking":
                        y = mltrain.allreduce(x, op)
                    else:
                        h = mltrain.allreduce_async(x, op)
                        y = h.wait()
                        assert h.done()
                    assert y is x and A.ptr(y) == p, "allreduce is not in place"
                    check(f"{kind} {dtype} allreduce {op} {mode}", A.f64(x),
                          A.rounded(reduce_ref(op, inputs, dtype), dtype) if dtype.startswith("float") or dtype == "bfloat16"
                          else reduce_ref(op, inputs, dtype), dtype, op, n)
                    checks += 1
            for root in range(n):
                x = A.make(base(r, COUNT, dtype), dtype)
                mltrain.broadcast(x, root) if root % 2 == 0 else mltrain.broadcast_async(x, root).wait()
                check(f"{kind} {dtype} broadcast root {root}", A.f64(x), inputs[root], dtype, "bcast", n)
                checks += 1
            x = A.make(base(r, COUNT, dtype), dtype)
            g = mltrain.allgather(x)
            check(f"{kind} {dtype} allgather", A.f64(g), np.concatenate(inputs), dtype, "gather", n)
            out = A.make(np.zeros(COUNT * n), dtype)
            assert mltrain.allgather_async(x, out=out).wait() is out
            check(f"{kind} {dtype} allgather async out", A.f64(out), np.concatenate(inputs), dtype, "gather", n)
            checks += 2
            big = [A.rounded(base(k, COUNT * n, dtype), dtype) for k in range(n)]
            for op in OPS:
                x = A.make(base(r, COUNT * n, dtype), dtype)
                got = mltrain.reduce_scatter(x, op)
                assert got.shape[0] == COUNT, got.shape
                full = reduce_ref(op, big, dtype)
                if dtype.startswith("float") or dtype == "bfloat16":
                    full = A.rounded(full, dtype)
                check(f"{kind} {dtype} reduce_scatter {op}", A.f64(got), full[r * COUNT:(r + 1) * COUNT],
                      dtype, op, n)
                checks += 1
    # Many async operations in flight at once, then a blocking one: they complete in order.
    xs = [np.full(4096, r + k, np.int64) for k in range(16)]
    hs = [mltrain.allreduce_async(x) for x in xs]
    mltrain.barrier()
    assert all(h.done() for h in hs)
    for k, x in enumerate(xs):
        assert (x == sum(q + k for q in range(n))).all(), k
    checks += 1
    print(f"OPS-OK {checks} {mltrain.__file__} {mltrain.library_path()}", flush=True)
    mltrain.shutdown()


if __name__ == "__main__":
    sys.exit(main())
