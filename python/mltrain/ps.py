"""Parameter-server mode: push and pull keys held by the servers of a `mltrain run` job with a
`[ps]` table (the servers run inside the mltrain agents; docs/python.md, "Parameter-server mode").

    import numpy as np
    import mltrain.ps as ps

    ps.init()                                   # from MLTRAIN_PS_SERVERS, RANK, ... (idempotent)
    w = np.zeros(1000, np.float32)
    ps.declare("w", w)                          # every worker declares the same keys
    g = compute_gradient(w)
    ps.push_pull("w", g)                        # sync servers: g is now the sum over the workers
    h = ps.push_pull_async("w", g)              # ... while this thread computes
    h.wait()

Sync servers: round r of a key is every worker's r-th push of it, and a pull returns exactly their
sum (never a mix of rounds); before any push it returns the declared initial value. Async servers:
each push is applied at once by the server-side optimizer ([ps.optimizer]; without one it is
added), and a pull returns the latest value.

Keys are integers 0 .. 2**64-1, or strings (hashed to 64 bits: `key_of`). Arrays are numpy arrays
or CPU torch tensors, C-contiguous, of the declared element count and dtype; the library reads and
writes them in place, with no copy. An async call's arrays must stay valid and untouched until its
handle is waited: the handle keeps a reference to them, and waits in __del__ if it is dropped
unwaited. Failures raise mltrain.CommError with the library's message.
"""
import ctypes
import hashlib
import queue
import threading
import traceback
import weakref

from . import _capi, _common
from . import CommError, _NUMPY_DTYPES, _TORCH_DTYPES, _is_torch, _view

__all__ = ["Client", "Handle", "init", "is_initialized", "shutdown", "client", "worker",
           "num_workers", "num_servers", "is_sync", "key_of", "declare", "push", "pull",
           "push_pull", "push_async", "pull_async", "push_pull_async"]

_DTYPE_NAMES = {v: k for k, v in _NUMPY_DTYPES.items()}  # C dtype -> "float32", ...
_ITEMSIZE = {_capi.F32: 4, _capi.F64: 8, _capi.F16: 2, _capi.BF16: 2, _capi.I32: 4, _capi.I64: 8,
             _capi.U8: 1}
_MAX_KEY = (1 << 64) - 1


def key_of(key):
    """The 64-bit key of `key`: an int (0 .. 2**64-1) as it is; a str hashed (BLAKE2b, 8 bytes),
    the same on every worker and in every run."""
    if isinstance(key, bool):
        raise TypeError("ps: a key is an int (0 .. 2**64-1) or a str, not a bool")
    if isinstance(key, int):
        if not 0 <= key <= _MAX_KEY:
            raise ValueError(f"ps: key {key} is out of range 0 .. 2**64-1")
        return key
    if isinstance(key, str):
        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    try:  # numpy integers
        import operator
        return key_of(operator.index(key))
    except TypeError:
        pass
    raise TypeError(f"ps: a key is an int (0 .. 2**64-1) or a str, not {type(key).__name__}")


def _show(key):
    return repr(key) if isinstance(key, str) else str(key)


def _dtype_code(dtype):
    """The C dtype of a numpy dtype, torch dtype, or name ("float32", "bfloat16", ...)."""
    s = str(dtype)
    if s in _TORCH_DTYPES:
        return _TORCH_DTYPES[s]
    try:
        import numpy
        name = numpy.dtype(dtype).name
    except Exception:  # noqa: BLE001 - "bfloat16", and anything numpy does not know
        name = s
    code = _NUMPY_DTYPES.get(name)
    if code is None:
        raise TypeError(f"ps.declare: dtype {dtype} is not supported; use one of "
                        + ", ".join(_NUMPY_DTYPES))
    return code


def _is_dtype(d):
    if isinstance(d, (int, tuple, list)) or d is None:
        return False
    try:
        _dtype_code(d)
        return True
    except TypeError:
        return False


def _count_of(shape):
    if isinstance(shape, bool):
        raise TypeError("ps.declare: a shape is an int or a tuple of ints")
    if isinstance(shape, int):
        shape = (shape,)
    n = 1
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise TypeError(f"ps.declare: shape {shape!r}: use an int or a tuple of non-negative ints")
        n *= d
    return n


def _host_view(x, what, writable):
    """_view, for the servers: CPU memory only (the servers run on CPUs)."""
    if _is_torch(x) and getattr(x, "device", None) is not None and x.device.type != "cpu":
        raise ValueError(f"{what}: a {x.device.type} tensor; the parameter servers take numpy arrays "
                         "and CPU tensors: pass x.cpu() (and copy the result back)")
    return _view(x, what, writable)


def _filled(count, dtype_code, value):
    """A new array of count elements of dtype, every one `value` (numpy; torch for bfloat16)."""
    if dtype_code == _capi.BF16:
        import torch
        return torch.full((count,), float(value), dtype=torch.bfloat16)
    import numpy
    return numpy.full(count, value, dtype=_DTYPE_NAMES[dtype_code])


def _run_callback(cb, handle):
    """A done-callback's error is printed, not raised: it must not stop the handles after it."""
    try:
        cb(handle)
    except Exception:  # noqa: B902
        traceback.print_exc()


# --- handles --------------------------------------------------------------------------------------

class Handle(_common.Handle):
    """A request started by an *_async call. wait() returns its result (the output array, None for
    a push) or raises its CommError; done() says whether wait() would return at once. The arrays
    stay referenced until it is waited; a handle dropped unwaited waits in __del__, so the library
    never writes memory Python has freed. wait() and exception() wait in the library."""

    def __init__(self, client, hptr, keep, result, what):
        super().__init__(result)
        self._client = client
        self._h = hptr            # ctypes.c_void_p; None once waited (mltrain_ps_wait frees it)
        self._keep = keep         # the arrays the library reads and writes
        self._what = what
        self._lock = threading.Lock()  # held while waiting in the library
        client._track(self)

    def _settle(self):
        """Waits in the library once (the first caller does; the others wait on the lock)."""
        with self._lock:
            if self._h is None:
                return
            lib, h = self._client._lib, self._h
            rc = lib.mltrain_ps_wait(h)
            error = self._client._error(rc, self._what) if rc != 0 else None
            self._h = None
            self._keep = None
        self._finished(error)

    def _run_callback(self, cb):
        _run_callback(cb, self)

    def _first_callback(self):
        self._client._wait_in_background(self)

    def done(self):
        if self._done.is_set():
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another thread is waiting in the library
        try:
            return self._h is None or self._client._lib.mltrain_ps_done(self._h) == 1
        finally:
            self._lock.release()

    def __del__(self):
        try:
            if self._h is not None:
                self._settle()
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone
            pass


# --- the client -----------------------------------------------------------------------------------

class Client:
    """This process's client of the job's parameter servers (one per process: use init())."""

    def __init__(self):
        lib = _capi.load()
        if not getattr(lib, "has_ps", False):
            raise CommError(f"mltrain-comm: {lib.path} has no parameter-server API (mltrain_ps_*); "
                            "use the library delivered by `mltrain run`", "usage")
        self._lib = lib
        ptr = ctypes.c_void_p()
        rc = lib.mltrain_ps_init_from_env(ctypes.byref(ptr))
        if rc != 0:
            raise self._error(rc, "ps.init")
        self._ptr = ptr
        self.worker = lib.mltrain_ps_worker(ptr)
        self.num_workers = lib.mltrain_ps_num_workers(ptr)
        self.num_servers = lib.mltrain_ps_num_servers(ptr)
        self.sync = lib.mltrain_ps_is_sync(ptr) == 1
        self._keys = {}  # key -> (count, C dtype), as declared by this worker
        self._keys_lock = threading.Lock()
        self._handles = weakref.WeakSet()  # unwaited handles, waited before the client goes
        self._handles_lock = threading.Lock()
        self._waitq = None
        self._waiter = None
        self._waiter_lock = threading.Lock()

    # errors
    def _error(self, rc, what):
        msg = self._lib.mltrain_comm_last_error()
        text = msg.decode(errors="replace") if msg else f"mltrain-comm: {what}: error {rc}"
        return CommError(text, _capi.STATUS_NAMES.get(rc, "internal"))

    def _check(self, rc, what):
        if rc != 0:
            raise self._error(rc, what)

    def _ptr_or_raise(self):
        if self._ptr is None:
            raise CommError("mltrain-comm: the parameter-server client is closed (ps.shutdown())",
                            "usage")
        return self._ptr

    def _usage(self, what, why):
        return CommError(f"mltrain-comm: ps worker {self.worker}: {what}: {why}", "usage")

    # handles
    def _track(self, h):
        with self._handles_lock:
            self._handles.add(h)

    def _wait_in_background(self, h):
        """Waits for h on the client's waiter thread (in the order handed over), which then runs
        h's callbacks: how a DDP hook's future completes without blocking the backward pass."""
        with self._waiter_lock:
            if self._waiter is None:
                self._waitq = queue.SimpleQueue()
                self._waiter = threading.Thread(target=self._serve, name="mltrain-ps-wait",
                                                daemon=True)
                self._waiter.start()
            self._waitq.put(h)

    def _serve(self):
        while True:
            h = self._waitq.get()
            if h is None:
                return
            try:
                h._settle()
            except BaseException:  # noqa: B902 - the handles after it must still finish
                traceback.print_exc()

    # arguments
    def _declared(self, key, what):
        k = key_of(key)
        with self._keys_lock:
            d = self._keys.get(k)
        if d is None:
            raise self._usage(f"{what} of key {_show(key)}",
                              "the key is not declared; every worker calls ps.declare(key, ...) "
                              "for it first")
        return k, d

    def _buffer(self, x, key, decl, what, writable):
        addr, n, dt = _host_view(x, f"ps.{what} (key {_show(key)})", writable)
        count, dtype = decl
        if n != count or dt != dtype:
            raise ValueError(f"ps.{what}: key {_show(key)} is declared as {count} x "
                             f"{_DTYPE_NAMES[dtype]}; this array is {n} x {_DTYPE_NAMES[dt]}")
        return addr

    # the API
    def declare(self, key, x, init=None, dtype=None):
        """Declares `key` on the servers: x is an array (its element count and dtype; not its
        values), a shape with dtype=..., or a (shape, dtype) pair. `init`: the initial value, an
        array of as many elements of that dtype or a number (default zeros; pass init=x to start
        from x's values). Blocking. Every worker declares the same keys with the same count and
        dtype (the first declaration's value wins); declaring again with the same count and dtype
        is a no-op."""
        k = key_of(key)
        if dtype is not None:
            count, code = _count_of(x), _dtype_code(dtype)
        elif isinstance(x, tuple) and len(x) == 2 and _is_dtype(x[1]):
            count, code = _count_of(x[0]), _dtype_code(x[1])
        elif isinstance(x, (int, tuple, list)) and not isinstance(x, bool):
            raise TypeError(f"ps.declare(key {_show(key)}): a shape needs a dtype: "
                            "declare(key, shape, dtype=...) or declare(key, (shape, dtype))")
        else:
            _, count, code = _host_view(x, f"ps.declare (key {_show(key)})", False)
        iaddr = None
        if init is not None:
            if isinstance(init, (int, float)) and not isinstance(init, bool):
                init = _filled(count, code, init)
            iaddr, n, dt = _host_view(init, f"ps.declare init (key {_show(key)})", False)
            if n != count or dt != code:
                raise ValueError(f"ps.declare: key {_show(key)} is {count} x {_DTYPE_NAMES[code]}; "
                                 f"init is {n} x {_DTYPE_NAMES[dt]}")
        p = self._ptr_or_raise()
        self._check(self._lib.mltrain_ps_declare(p, k, count, code, iaddr), "declare")  # `init` alive
        with self._keys_lock:
            self._keys[k] = (count, code)

    def declared(self, key):
        """(count, dtype name) of a key this worker declared, or None."""
        with self._keys_lock:
            d = self._keys.get(key_of(key))
        return None if d is None else (d[0], _DTYPE_NAMES[d[1]])

    def _push_args(self, key, x):
        k, d = self._declared(key, "push")
        return k, self._buffer(x, key, d, "push", False)

    def _pull_args(self, key, out):
        k, d = self._declared(key, "pull")
        return k, self._buffer(out, key, d, "pull", True)

    def _push_pull_args(self, key, x, out):
        k, d = self._declared(key, "push_pull")
        if out is None:
            a = self._buffer(x, key, d, "push_pull", True)
            return k, a, a, x
        send = self._buffer(x, key, d, "push_pull", False)
        return k, send, self._buffer(out, key, d, "push_pull output", True), out

    def push(self, key, x):
        """Pushes x to the key (sync: this worker's next round; async: applied at once)."""
        k, a = self._push_args(key, x)
        self._check(self._lib.mltrain_ps_push(self._ptr_or_raise(), k, a), "push")

    def pull(self, key, out):
        """The key's value into `out` (sync: the sum of this worker's latest round, or the initial
        value before any push; async: the latest value). Returns out."""
        k, a = self._pull_args(key, out)
        self._check(self._lib.mltrain_ps_pull(self._ptr_or_raise(), k, a), "pull")
        return out

    def push_pull(self, key, x, out=None):
        """push(key, x), then that round's pull into `out` (x itself when out is None: in place).
        Returns the output."""
        k, s, r, res = self._push_pull_args(key, x, out)
        self._check(self._lib.mltrain_ps_push_pull(self._ptr_or_raise(), k, s, r), "push_pull")
        return res

    def _start(self, fn, args, keep, result, what):
        h = ctypes.c_void_p()
        self._check(fn(self._ptr_or_raise(), *args, ctypes.byref(h)), what)
        return Handle(self, h, keep, result, what)

    def push_async(self, key, x):
        k, a = self._push_args(key, x)
        return self._start(self._lib.mltrain_ps_push_async, (k, a), (x,), None, "push")

    def pull_async(self, key, out):
        k, a = self._pull_args(key, out)
        return self._start(self._lib.mltrain_ps_pull_async, (k, a), (out,), out, "pull")

    def push_pull_async(self, key, x, out=None):
        k, s, r, res = self._push_pull_args(key, x, out)
        return self._start(self._lib.mltrain_ps_push_pull_async, (k, s, r), (x, out), res,
                           "push_pull")

    def close(self):
        """Waits for the requests in flight, then disconnects. Idempotent."""
        if self._ptr is None:
            return
        with self._handles_lock:
            pending = list(self._handles)
        for h in pending:
            try:
                h._settle()
            except Exception:  # noqa: BLE001 - an error stays with its handle
                pass
        with self._waiter_lock:
            if self._waiter is not None:
                self._waitq.put(None)
                self._waiter.join()
                self._waiter = None
        self._lib.mltrain_ps_destroy(self._ptr)
        self._ptr = None


# --- the process's client -------------------------------------------------------------------------

_default = _common.ProcessDefault(Client, "mltrain.ps is not initialized: call mltrain.ps.init() first")


def init():
    """Connects to the job's parameter servers from the rank environment (MLTRAIN_PS_SERVERS,
    RANK, WORLD_SIZE, MLTRAIN_TOKEN, ...: what `mltrain run` sets for a job with [ps]).
    Idempotent. Returns the process's Client."""
    return _default.init()


def is_initialized():
    return _default.is_initialized()


def shutdown():
    """Waits for the requests in flight and disconnects (also at exit). init() may connect again."""
    _default.shutdown()


def client():
    """The process's Client (init() first)."""
    return _default.get()


def worker():
    return client().worker


def num_workers():
    return client().num_workers


def num_servers():
    return client().num_servers


def is_sync():
    return client().sync


def declare(key, x, init=None, dtype=None):
    return client().declare(key, x, init, dtype)


def push(key, x):
    return client().push(key, x)


def pull(key, out):
    return client().pull(key, out)


def push_pull(key, x, out=None):
    return client().push_pull(key, x, out)


def push_async(key, x):
    return client().push_async(key, x)


def pull_async(key, out):
    return client().pull_async(key, out)


def push_pull_async(key, x, out=None):
    return client().push_pull_async(key, x, out)
