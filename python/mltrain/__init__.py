"""mltrain: the collectives of libmltrain-comm for Python workers started by `mltrain run`.

    import mltrain
    mltrain.init()                       # joins the job from the rank environment
    x = numpy.ones(1 << 20, numpy.float32)
    mltrain.allreduce(x)                 # in place: x is now the sum over every rank
    h = mltrain.allreduce_async(y, "avg")
    ...                                  # compute while it runs
    h.wait()

Arrays are numpy arrays or CPU torch tensors, C-contiguous; results land in them in place, with
no copy. Every rank makes the same calls in the same order (collectives). A failure raises
CommError with the library's message, which names the rank and host that did not answer; after
one, the communicator is broken and every later call raises too. Pure Python over the C API
(comm/include/mltrain/comm.h): hosts need no compiler. docs/python.md has the whole story.
Parameter-server mode (a job spec with [ps]): `import mltrain.ps` (push, pull, push_pull).
"""
import ctypes
import queue
import threading

from . import _capi, _common, _env
from .metrics import log

__all__ = [
    "CommError", "Communicator", "Handle", "init", "is_initialized", "shutdown", "rank", "size",
    "local_rank", "local_size", "allreduce", "allreduce_async", "broadcast", "broadcast_async",
    "allgather", "allgather_async", "reduce_scatter", "reduce_scatter_async", "barrier",
    "library_path", "log",
]

OPS = {"sum": _capi.SUM, "prod": _capi.PROD, "min": _capi.MIN, "max": _capi.MAX, "avg": _capi.AVG}


class CommError(RuntimeError):
    """A collective failed. str() is the library's message (it names the rank and host that did
    not answer); `code` is the C status name: usage, store, timeout, peer, mismatch or internal."""

    def __init__(self, message, code="internal"):
        super().__init__(message)
        self.code = code


def library_path():
    """The libmltrain-comm this process loads (see mltrain._capi)."""
    return _capi.library_path()


# --- arrays ---------------------------------------------------------------------------------------

_NUMPY_DTYPES = {"float32": _capi.F32, "float64": _capi.F64, "float16": _capi.F16,
                 "bfloat16": _capi.BF16, "int32": _capi.I32, "int64": _capi.I64, "uint8": _capi.U8}
_TORCH_DTYPES = {"torch.float32": _capi.F32, "torch.float64": _capi.F64, "torch.float16": _capi.F16,
                 "torch.bfloat16": _capi.BF16, "torch.int32": _capi.I32, "torch.int64": _capi.I64,
                 "torch.uint8": _capi.U8}


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _dtype_name(x):
    """x's dtype as its library spells it (float64, torch.bfloat16)."""
    return str(x.dtype) if _is_torch(x) else getattr(x.dtype, "name", str(x.dtype))


def _view(x, what, writable, comm=None):
    """(address, element count, C dtype) of a contiguous numpy array or torch tensor; CUDA
    tensors only when `comm` uses the NCCL backend."""
    if _is_torch(x):
        if x.device.type == "cuda":
            if comm is None or not comm.nccl:
                why = comm.backend_reason if comm is not None else "no communicator"
                raise ValueError(f"{what}: a cuda tensor, but this job uses the CPU backend ({why}); "
                                 "move it with .cpu(), or give every rank its own GPU")
        elif x.device.type != "cpu":
            raise ValueError(f"{what}: a {x.device.type} tensor; mltrain reduces CPU tensors, and "
                             "CUDA tensors with the NCCL backend")
        dtype = _TORCH_DTYPES.get(str(x.dtype))
        if dtype is None:
            raise TypeError(f"{what}: dtype {x.dtype} is not supported; use one of "
                            + ", ".join(_TORCH_DTYPES))
        if not x.is_contiguous():
            raise ValueError(f"{what}: the tensor is not contiguous; pass x.contiguous() and use "
                             "the result")
        return x.data_ptr(), x.numel(), dtype
    if type(x).__module__ == "numpy" and hasattr(x, "__array_interface__"):
        dtype = _NUMPY_DTYPES.get(x.dtype.name)
        if dtype is None:
            raise TypeError(f"{what}: dtype {x.dtype} is not supported; use one of "
                            + ", ".join(k for k in _NUMPY_DTYPES if k != "bfloat16"))
        if not x.flags.c_contiguous:
            raise ValueError(f"{what}: the array is not C-contiguous; pass "
                             "numpy.ascontiguousarray(x) and use the result")
        if writable and not x.flags.writeable:
            raise ValueError(f"{what}: the array is read-only and the result lands in it")
        return x.__array_interface__["data"][0], x.size, dtype
    raise TypeError(f"{what}: expected a numpy array or a torch tensor, not {type(x).__name__}")


def _empty_like(x, shape):
    if _is_torch(x):
        import torch
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    import numpy
    return numpy.empty(shape, dtype=x.dtype)


def _op_code(op):
    if isinstance(op, int) and op in OPS.values():
        return op
    code = OPS.get(str(op).lower())
    if code is None:
        raise ValueError(f"op {op!r}: use one of {', '.join(OPS)}")
    return code


# --- handles and the communicator -----------------------------------------------------------------

class Handle(_common.Handle):
    """An operation started by an *_async call. wait() returns its result (the output array) or
    raises its CommError. The arrays stay referenced until it is done. Runs on the communicator's
    thread (_run)."""

    def __init__(self, fn, result):
        super().__init__(result)
        self._fn = fn

    def _run(self):
        error = None
        try:
            self._fn()
        except BaseException as e:  # noqa: B902 - delivered to wait()
            error = e
        self._fn = None
        self._finished(error)


class Communicator:
    """One rank's membership in the job: rank, size, local_rank, local_size and the collectives.
    Made by init() (or Communicator() for one of your own) from the rank environment that
    `mltrain run` (or torchrun) sets. Not for use from several threads at once."""

    def __init__(self):
        self._lib = _capi.load()
        ptr = ctypes.c_void_p()
        self._call(self._lib.mltrain_comm_init_from_env, ctypes.byref(ptr))
        self._ptr = ptr
        self.rank = self._lib.mltrain_comm_rank(ptr)
        self.size = self._lib.mltrain_comm_size(ptr)
        self.local_rank = _env.local_rank()
        self.local_size = _env.local_world_size()
        #: "nccl" when device (CUDA) buffers go through NCCL, else "tcp" (the CPU backend).
        self.nccl = self._lib.mltrain_comm_backend(ptr) == 1
        self.backend = "nccl" if self.nccl else "tcp"
        #: Why that backend, in one line.
        self.backend_reason = self._lib.mltrain_comm_backend_reason(ptr).decode(errors="replace")
        self._queue = None
        self._worker = None
        self._last = None  # the latest async operation, for ordering with blocking calls

    def _call(self, fn, *args):
        rc = fn(*args)
        if rc != 0:
            msg = self._lib.mltrain_comm_last_error()
            raise CommError(msg.decode(errors="replace") if msg else f"error {rc}",
                            _capi.STATUS_NAMES.get(rc, "internal"))

    def _ptr_or_raise(self):
        if self._ptr is None:
            raise CommError("the communicator is closed", "usage")
        return self._ptr

    # Blocking calls run on the caller's thread once every earlier async call has finished, so
    # every rank sees the same order. ctypes drops the GIL inside the C call.
    def _blocking(self, fn):
        if self._last is not None and not self._last.done():
            self._last._done.wait()
        fn()

    def _async(self, fn, result):
        if self._worker is None:
            self._queue = queue.SimpleQueue()
            self._worker = threading.Thread(target=self._serve, name="mltrain-comm", daemon=True)
            self._worker.start()
        h = Handle(fn, result)
        self._last = h
        self._queue.put(h)
        return h

    def _serve(self):
        while True:
            h = self._queue.get()
            if h is None:
                return
            h._run()

    def _on_stream(self, x, fn):
        """fn, run on the caller's current CUDA stream when x is a CUDA tensor (NCCL enqueues
        there, after the work that produced x; the call returns when it is done)."""
        if not (_is_torch(x) and x.device.type == "cuda"):
            return fn
        import torch
        stream = ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream)
        p = self._ptr

        def run():
            self._call(self._lib.mltrain_comm_set_cuda_stream, p, stream)
            fn()
        return run

    def _allreduce_fn(self, x, op):
        addr, n, dt = _view(x, "allreduce", True, self)
        code = _op_code(op)
        p = self._ptr_or_raise()
        return self._on_stream(x, lambda: self._call(self._lib.mltrain_comm_allreduce, p, addr, addr, n, dt,
                                                     code))

    def _broadcast_fn(self, x, root):
        addr, n, dt = _view(x, "broadcast", True, self)
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast: root {root} is not a rank (size {self.size})")
        p = self._ptr_or_raise()
        return self._on_stream(x, lambda: self._call(self._lib.mltrain_comm_broadcast, p, addr, n, dt, root))

    def _allgather_fn(self, x, out):
        addr, n, dt = _view(x, "allgather input", False, self)
        if out is None:
            out = _empty_like(x, (self.size * x.shape[0],) + tuple(x.shape[1:]) if x.ndim else (self.size,))
        oaddr, on, odt = _view(out, "allgather output", True, self)
        if odt != dt:
            raise ValueError(f"allgather: the output is {_dtype_name(out)} and the input "
                             f"{_dtype_name(x)}: give an output of the input's dtype")
        if on != n * self.size:
            raise ValueError(f"allgather: the output needs {n * self.size} elements of the input's "
                             f"dtype, it has {on}")
        p = self._ptr_or_raise()
        return self._on_stream(x, lambda: self._call(self._lib.mltrain_comm_allgather, p, addr, oaddr, n,
                                                     dt)), out

    def _reduce_scatter_fn(self, x, op, out):
        addr, n, dt = _view(x, "reduce_scatter input", False, self)
        if n % self.size:
            raise ValueError(f"reduce_scatter: {n} elements do not split into {self.size} equal "
                             "blocks; pad the input to a multiple of the job size")
        rn = n // self.size
        if out is None:
            shape = ((x.shape[0] // self.size,) + tuple(x.shape[1:])
                     if x.ndim and x.shape[0] % self.size == 0 else (rn,))
            out = _empty_like(x, shape)
        oaddr, on, odt = _view(out, "reduce_scatter output", True, self)
        if odt != dt:
            raise ValueError(f"reduce_scatter: the output is {_dtype_name(out)} and the input "
                             f"{_dtype_name(x)}: give an output of the input's dtype")
        if on != rn:
            raise ValueError(f"reduce_scatter: the output needs {rn} elements of the input's "
                             f"dtype, it has {on}")
        code = _op_code(op)
        p = self._ptr_or_raise()
        return self._on_stream(x, lambda: self._call(self._lib.mltrain_comm_reduce_scatter, p, addr, oaddr,
                                                     rn, dt, code)), out

    def allreduce(self, x, op="sum"):
        """Reduces x over every rank, in place (op: sum, prod, min, max, avg). Returns x."""
        self._blocking(self._allreduce_fn(x, op))
        return x

    def allreduce_async(self, x, op="sum"):
        return self._async(self._allreduce_fn(x, op), x)

    def _allreduce_shared_async(self, t, op, key, box, file=None):
        """allreduce_async of a CPU tensor whose result may come back in shared memory
        (Communicator::allreduce_shared in mltrain/comm.hpp): once done, box[0] is t or a tensor
        over the key's shared region, valid until this rank's next call with the key or
        _release_shared(key). file: (fd, offset) when t lies in a shared file (its peers on this
        host then read it there). For mltrain.torch.allreduce_hook."""
        addr, n, dt = _view(t, "allreduce", True, self)
        code = _op_code(op)
        p = self._ptr_or_raise()
        out = ctypes.c_void_p()
        fd, offset = file if file is not None else (-1, 0)

        def run():
            self._call(self._lib.mltrain_comm_allreduce_shared_file, p, addr, n, dt, code, key, fd, offset,
                       ctypes.byref(out))
            if out.value is not None and out.value != addr:
                import torch
                raw = (ctypes.c_char * (n * t.element_size())).from_address(out.value)
                box[0] = torch.frombuffer(raw, dtype=t.dtype).view(t.shape)
        return self._async(run, t)

    def _allreduce_mapped_async(self, t, op, key, file):
        """allreduce_async of a CPU tensor lying in a shared file (file: (fd, offset)): ranks on
        this host read and write each other's tensors there (Communicator::allreduce_mapped).
        For mltrain.torch.allreduce_hook on buckets that DDP's gradients view."""
        addr, n, dt = _view(t, "allreduce", True, self)
        code = _op_code(op)
        p = self._ptr_or_raise()
        fd, offset = file
        return self._async(lambda: self._call(self._lib.mltrain_comm_allreduce_mapped, p, addr, n, dt, code,
                                              key, fd, offset), t)

    def _release_shared(self, key):
        if self._ptr is not None:
            self._call(self._lib.mltrain_comm_release_shared, self._ptr, key)

    def broadcast(self, x, root=0):
        """Copies root's x into x on every rank, in place. Returns x."""
        self._blocking(self._broadcast_fn(x, root))
        return x

    def broadcast_async(self, x, root=0):
        return self._async(self._broadcast_fn(x, root), x)

    def allgather(self, x, out=None):
        """Concatenates every rank's x along the first axis (rank order). Returns the output: `out`
        (size * x.size elements) or a new array."""
        fn, out = self._allgather_fn(x, out)
        self._blocking(fn)
        return out

    def allgather_async(self, x, out=None):
        fn, out = self._allgather_fn(x, out)
        return self._async(fn, out)

    def reduce_scatter(self, x, op="sum", out=None):
        """Reduces x over every rank and returns this rank's block of the result (x.size / size
        elements; block i goes to rank i): `out` or a new array."""
        fn, out = self._reduce_scatter_fn(x, op, out)
        self._blocking(fn)
        return out

    def reduce_scatter_async(self, x, op="sum", out=None):
        fn, out = self._reduce_scatter_fn(x, op, out)
        return self._async(fn, out)

    def barrier(self):
        p = self._ptr_or_raise()
        self._blocking(lambda: self._call(self._lib.mltrain_comm_barrier, p))

    def barrier_async(self):
        p = self._ptr_or_raise()
        return self._async(lambda: self._call(self._lib.mltrain_comm_barrier, p), None)

    def close(self):
        """Waits for the async operations in flight, then leaves the job. Idempotent."""
        if self._ptr is None:
            return
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None
        self._lib.mltrain_comm_destroy(self._ptr)
        self._ptr = None


# --- the process's communicator -------------------------------------------------------------------

_default = _common.ProcessDefault(Communicator, "mltrain is not initialized: call mltrain.init() first")


def init():
    """Joins the job from the rank environment (RANK, WORLD_SIZE, MLTRAIN_STORE or MASTER_ADDR /
    MASTER_PORT, MLTRAIN_TOKEN: what `mltrain run` sets). Collective; idempotent. Returns the
    process's Communicator."""
    return _default.init()


def is_initialized():
    return _default.is_initialized()


def shutdown():
    """Leaves the job (after the async operations in flight). init() may join again."""
    _default.shutdown()


def _comm():
    return _default.get()


def rank():
    return _comm().rank


def size():
    return _comm().size


def local_rank():
    return _comm().local_rank


def local_size():
    return _comm().local_size


def allreduce(x, op="sum"):
    return _comm().allreduce(x, op)


def allreduce_async(x, op="sum"):
    return _comm().allreduce_async(x, op)


def broadcast(x, root=0):
    return _comm().broadcast(x, root)


def broadcast_async(x, root=0):
    return _comm().broadcast_async(x, root)


def allgather(x, out=None):
    return _comm().allgather(x, out)


def allgather_async(x, out=None):
    return _comm().allgather_async(x, out)


def reduce_scatter(x, op="sum", out=None):
    return _comm().reduce_scatter(x, op, out)


def reduce_scatter_async(x, op="sum", out=None):
    return _comm().reduce_scatter_async(x, op, out)


def barrier():
    return _comm().barrier()
