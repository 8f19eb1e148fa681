"""The C API of libmltrain-comm (comm/include/mltrain/comm.h) through ctypes.

The library is found by absolute path, never through LD_LIBRARY_PATH:
  1. MLTRAIN_COMM_LIB (the agent of `mltrain run` sets it to the copy it delivered to the host);
  2. the runtime layout the package travels in: <runtime>/python/mltrain -> <runtime>/lib;
  3. a copy beside the package (a wheel that bundles one);
  4. the system's libmltrain-comm.so.0 (`cmake --install`).
"""
import ctypes
import ctypes.util
import os
import threading

from . import _env

LIB_NAME = "libmltrain-comm.so.0"

# enum mltrain_dtype / mltrain_redop / mltrain_comm_status
F32, F64, F16, BF16, I32, I64, U8 = range(7)
SUM, PROD, MIN, MAX, AVG = range(5)
STATUS_NAMES = {1: "usage", 2: "store", 3: "timeout", 4: "peer", 5: "mismatch", 6: "internal"}

_lock = threading.Lock()
_lib = None


def library_path():
    """Where libmltrain-comm is loaded from (None when it is nowhere to be found)."""
    env = _env.comm_lib()
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "..", "lib", LIB_NAME), os.path.join(here, LIB_NAME)):
        if os.path.exists(cand):
            return os.path.normpath(cand)
    return ctypes.util.find_library("mltrain-comm")


def load():
    """The loaded library, its prototypes declared; raises ImportError saying where it looked."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not path:
            raise ImportError(
                "libmltrain-comm not found: MLTRAIN_COMM_LIB is not set and no copy is installed; "
                "run the script under `mltrain run` (its agent delivers the library), or set "
                "MLTRAIN_COMM_LIB to a built libmltrain-comm.so.0")
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise ImportError(f"cannot load libmltrain-comm from {path}: {e}") from None
        p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        protos = {
            "mltrain_comm_init_from_env": ([ctypes.POINTER(p)], i),
            "mltrain_comm_destroy": ([p], i),
            "mltrain_comm_rank": ([p], i),
            "mltrain_comm_size": ([p], i),
            "mltrain_comm_allreduce": ([p, p, p, sz, i, i], i),
            "mltrain_comm_allreduce_shared_file": ([p, p, sz, i, i, ctypes.c_ulonglong, i, sz, ctypes.POINTER(p)], i),
            "mltrain_comm_allreduce_mapped": ([p, p, sz, i, i, ctypes.c_ulonglong, i, sz], i),
            "mltrain_comm_release_shared": ([p, ctypes.c_ulonglong], i),
            "mltrain_comm_broadcast": ([p, p, sz, i, i], i),
            "mltrain_comm_allgather": ([p, p, p, sz, i], i),
            "mltrain_comm_reduce_scatter": ([p, p, p, sz, i, i], i),
            "mltrain_comm_barrier": ([p], i),
            "mltrain_comm_backend": ([p], i),
            "mltrain_comm_backend_reason": ([p], ctypes.c_char_p),
            "mltrain_comm_set_cuda_stream": ([p, p], i),
            "mltrain_comm_last_error": ([], ctypes.c_char_p),
        }
        for name, (args, res) in protos.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res
        # Parameter-server mode (mltrain_ps_*): optional, so that a library built without it still
        # serves the collectives; mltrain.ps says so when it is missing.
        k = ctypes.c_ulonglong
        pp = ctypes.POINTER(p)
        ps_protos = {
            "mltrain_ps_init_from_env": ([pp], i),
            "mltrain_ps_destroy": ([p], i),
            "mltrain_ps_worker": ([p], i),
            "mltrain_ps_num_workers": ([p], i),
            "mltrain_ps_num_servers": ([p], i),
            "mltrain_ps_is_sync": ([p], i),
            "mltrain_ps_declare": ([p, k, sz, i, p], i),
            "mltrain_ps_push": ([p, k, p], i),
            "mltrain_ps_pull": ([p, k, p], i),
            "mltrain_ps_push_pull": ([p, k, p, p], i),
            "mltrain_ps_push_async": ([p, k, p, pp], i),
            "mltrain_ps_pull_async": ([p, k, p, pp], i),
            "mltrain_ps_push_pull_async": ([p, k, p, p, pp], i),
            "mltrain_ps_done": ([p], i),
            "mltrain_ps_wait": ([p], i),
        }
        lib.has_ps = True
        for name, (args, res) in ps_protos.items():
            fn = getattr(lib, name, None)
            if fn is None:
                lib.has_ps = False
                break
            fn.argtypes, fn.restype = args, res
        lib.path = path
        _lib = lib
        return lib
