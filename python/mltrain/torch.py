"""PyTorch on mltrain's collectives.

A stock DDP script moves its gradient traffic to mltrain with one line after wrapping the model:

    ddp = DistributedDataParallel(model)                            # gloo, as before
    ddp.register_comm_hook(None, mltrain.torch.allreduce_hook)      # gradients: mltrain

(None: the process's communicator, joined on first use; or pass mltrain.init()). For scripts
without DDP, Horovod style:

    mltrain.init()
    mltrain.torch.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = mltrain.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))

fixed_point_hook reduces gradients as 64-bit fixed-point integers: the sum is exact, so the
result does not depend on the order of reduction (ring, halving-doubling, host layout, backend).

ps_hook sends the buckets to the job's parameter servers instead ([ps] in the job spec, sync
servers), BytePS-style: ddp.register_comm_hook(None, mltrain.torch.ps_hook).
"""
import os

import torch

import mltrain as _ml

__all__ = ["allreduce_hook", "fixed_point_hook", "FixedPoint", "ps_hook", "PsHookState",
           "broadcast_parameters", "DistributedOptimizer"]


def _comm_of(state):
    if state is None:
        return _ml.init()
    if isinstance(state, _ml.Communicator):
        return state
    comm = getattr(state, "comm", None)
    return comm if comm is not None else _ml.init()


def _future_of(handle, finish):
    """A torch Future of finish()'s value once the handle is done, or of the handle's error: raised
    inside a then() callback, which is how torch hands a Python error to the waiting backward pass
    with its message intact."""
    fut = torch.futures.Future()
    handle.add_done_callback(lambda h: fut.set_result(None))

    def result(_):
        err = handle.exception()
        if err is not None:
            raise err
        return finish()

    return fut.then(result)


class _SharedResults:
    """Keys of allreduce_hook's shared results, one per (bucket index, size, dtype, occurrence in
    this backward pass): every rank numbers them alike, and two DDP models in one backward pass
    get regions of their own. A region unused for KEEP passes (DDP rebuilt its buckets) is
    released."""

    KEEP = 8

    def __init__(self, comm):
        self.comm = comm
        self.keys = {}  # (index, numel, dtype, occurrence) -> key
        self.last = {}  # key -> the pass that last used it
        self.uses = {}  # (index, numel, dtype) -> uses in this pass
        self.passes = 0
        self.next = 1
        self.queued = False

    def key(self, ident):
        """The key for this bucket, or None outside a backward pass (no end to count from)."""
        if not self.queued:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_pass)
            except RuntimeError:
                return None
            self.queued = True
        occurrence = self.uses.get(ident, 0)
        self.uses[ident] = occurrence + 1
        k = ident + (occurrence,)
        key = self.keys.get(k)
        if key is None:
            key = self.keys[k] = self.next
            self.next += 1
        self.last[key] = self.passes
        return key

    def file_of(self, t):
        """(fd, offset) of t in a shared file, moving its storage there on first sight, or None.
        t is a DDP bucket: torch's share_memory_ swaps the storage's memory in place, so every
        view DDP keeps of the bucket follows it. Only when every rank shares this host (peers
        read the bucket where it lies) and /dev/shm has room to spare: twice every local rank's
        copy plus the result (a full tmpfs would kill the process on first touch, not raise)."""
        comm = self.comm
        if comm.size < 2 or comm.local_size != comm.size:
            return None
        try:
            if hasattr(t, "untyped_storage"):
                st = t.untyped_storage()
            else:  # torch 1.x: a TypedStorage over the untyped one
                st = t.storage()
                st = getattr(st, "_storage", st)
            if not st.is_shared():
                vfs = os.statvfs("/dev/shm")
                if vfs.f_bavail * vfs.f_frsize < 2 * (comm.local_size + 1) * st.nbytes():
                    return None
            fd, _ = st._share_fd_cpu_()
        except (AttributeError, OSError, RuntimeError):
            return None  # another torch, no /dev/shm, or a storage shared by file name
        return fd, t.data_ptr() - st.data_ptr()

    def _end_of_pass(self):
        self.queued = False
        self.uses.clear()
        self.passes += 1
        for k, key in list(self.keys.items()):
            if self.passes - self.last[key] > self.KEEP:
                del self.keys[k], self.last[key]
                self.comm._release_shared(key)


def allreduce_hook(state, bucket):
    """DDP communication hook: the bucket's gradients averaged over every rank through mltrain
    (op avg: summed, divided once in the library's last pass over the data, no pass of its own).
    Asynchronous: the backward pass keeps computing while the bucket travels. When every rank
    shares one host, the result comes back in shared memory that DDP copies into the gradients
    itself (no copy back into the bucket: Communicator::allreduce_shared), and the bucket itself
    moves to shared memory on first use, where the other ranks read it (no copy in either).
    When the gradients are views into the bucket (DDP's gradient_as_bucket_view=True), DDP would
    copy a result held elsewhere back into the bucket: there every rank writes its reduced part
    into every rank's bucket instead (Communicator::allreduce_mapped), and DDP copies nothing."""
    comm = _comm_of(state)
    t = bucket.buffer()
    if t.device.type == "cpu":
        shared = getattr(comm, "_shared_results", None)
        if shared is None:
            shared = comm._shared_results = _SharedResults(comm)
        key = shared.key((bucket.index(), t.numel(), str(t.dtype)))
        if key is not None:
            file = shared.file_of(t)
            if file is not None and _grads_view(bucket, t):
                return _future_of(comm._allreduce_mapped_async(t, "avg", key, file), lambda: t)
            box = [t]
            return _future_of(comm._allreduce_shared_async(t, "avg", key, box, file), lambda: box[0])
    return _future_of(comm.allreduce_async(t, "avg"), lambda: t)


def _grads_view(bucket, t):
    """True when a gradient of the bucket's parameters lies inside the bucket buffer t (DDP's
    gradient_as_bucket_view=True: DDP then copies the hook's result into the bucket unless the
    result is the bucket itself). By the time DDP calls the hook, every gradient a rank computed
    views its bucket. A rank that computed none of a bucket's gradients (find_unused_parameters,
    gradients set to None) may answer otherwise than its peers: the call then puts the result
    in every rank's bucket, as the ranks that asked want, and returns the bucket there too."""
    try:
        params = bucket.parameters()
    except (AttributeError, RuntimeError):
        return False
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    for p in params:
        g = p.grad
        if g is not None and g.device == t.device and start <= g.data_ptr() < end:
            return True
    return False


class PsHookState:
    """State of ps_hook: `prefix` names the keys of one DDP model's buckets (two DDP models in one
    process need two prefixes); `client` is a mltrain.ps.Client (None: mltrain.ps.init())."""

    def __init__(self, prefix="ddp", client=None):
        self.prefix = str(prefix)
        self.client = client
        self.keys = {}  # (bucket index, numel, dtype) -> key, declared
        self.staging = {}  # key -> a CPU tensor a GPU bucket travels through


def _ps_state(state):
    if isinstance(state, PsHookState):
        return state
    # None or a prefix: one state per prefix, kept here (DDP hands the hook the same object back).
    prefix = "ddp" if state is None else str(state)
    st = _PS_STATES.get(prefix)
    if st is None:
        st = _PS_STATES.setdefault(prefix, PsHookState(prefix))
    return st


_PS_STATES = {}


def ps_hook(state, bucket):
    """DDP communication hook: each gradient bucket goes through a sync push_pull on the job's
    parameter servers ([ps] sync = true), then is divided by the number of workers: the average,
    bit for bit the same on every worker (the servers sum; every worker pulls the same bytes).
    Asynchronous: the backward pass keeps computing while the bucket travels.

    state: None, a str (a key prefix: give each DDP model of a process its own), or a
    PsHookState. Keys: the string key "mltrain.torch.ps_hook/<prefix>/<index>/<numel>/<dtype>"
    (mltrain.ps.key_of), declared with zeros on first use. DDP rebuilds its buckets after the
    first iteration, so a bucket index may come back with another size: that is another key,
    declared then (the servers keep the first iteration's keys; they are not used again)."""
    import mltrain.ps as ps
    st = _ps_state(state)
    client = st.client if st.client is not None else ps.init()
    if not client.sync:
        raise ValueError("ps_hook: the job's parameter servers are async ([ps] sync = false); the "
                         "hook averages gradients in sync rounds: set [ps] sync = true")
    t = bucket.buffer()
    ident = (bucket.index(), t.numel(), str(t.dtype))
    key = st.keys.get(ident)
    # The servers take CPU memory: a GPU bucket travels through a CPU tensor kept per key (pinned,
    # so the copies run at the bus's speed), as BytePS stages GPU gradients.
    staged = t.device.type != "cpu"
    buf = t
    if staged:
        buf = st.staging.get(ident)
        if buf is None:
            buf = torch.empty(t.numel(), dtype=t.dtype, device="cpu", pin_memory=torch.cuda.is_available())
            st.staging[ident] = buf
        buf.copy_(t)  # waits for the gradients on the current stream
    if key is None:
        key = ps.key_of("mltrain.torch.ps_hook/%s/%d/%d/%s" % ((st.prefix,) + ident))
        client.declare(key, buf)  # zeros; blocking, once per bucket shape
        st.keys[ident] = key
    n = client.num_workers

    def finish():
        if staged:
            t.copy_(buf)
        t.div_(n)
        return t

    return _future_of(client.push_pull_async(key, buf), finish)


class FixedPoint:
    """State of fixed_point_hook: gradients are rounded to multiples of 2**-frac_bits and summed
    as int64, exactly. |gradient| * world size must stay below 2**(63 - frac_bits)
    (2**31 / size with the default 32 bits); larger values raise instead of wrapping."""

    def __init__(self, frac_bits=32, comm=None):
        if not 0 <= frac_bits <= 52:
            raise ValueError("frac_bits must be within 0..52")
        self.frac_bits = frac_bits
        self.comm = comm


def to_fixed(t, frac_bits, size):
    """The int64 fixed-point form of gradient tensor t (checked against overflow of the sum)."""
    scaled = t.double() * float(2 ** frac_bits)
    limit = float(2 ** 62) / size
    if scaled.numel() and scaled.abs().max().item() >= limit:
        raise OverflowError(f"a gradient of magnitude {scaled.abs().max().item() / 2 ** frac_bits:.3g} "
                            f"overflows {frac_bits}-bit fixed point over {size} ranks; "
                            "lower FixedPoint(frac_bits=...)")
    return scaled.round().long()


def from_fixed(q, frac_bits, size, dtype):
    """The average from a summed fixed-point tensor, in the gradient dtype."""
    return (q.double() * (1.0 / float(2 ** frac_bits)) / size).to(dtype)


def fixed_point_hook(state, bucket):
    """DDP communication hook: averages the bucket exactly (see FixedPoint); the same result,
    bit for bit, on every rank and whatever the reduction order. state: a FixedPoint or None."""
    if not isinstance(state, FixedPoint):
        state = FixedPoint(comm=state)
    comm = _comm_of(state.comm)
    t = bucket.buffer()
    q = to_fixed(t, state.frac_bits, comm.size)

    def finish():
        t.copy_(from_fixed(q, state.frac_bits, comm.size, t.dtype))
        return t

    return _future_of(comm.allreduce_async(q, "sum"), finish)


def broadcast_parameters(params, root_rank=0, comm=None):
    """Copies root_rank's tensors into every rank's, in place: a state_dict, named_parameters(),
    or an iterable of tensors (same order on every rank)."""
    comm = _comm_of(comm)
    items = params.items() if hasattr(params, "items") else params
    handles = []
    with torch.no_grad():
        for item in items:
            t = item[1] if isinstance(item, tuple) else item
            if not torch.is_tensor(t):
                continue
            handles.append(comm.broadcast_async(t.data if t.requires_grad else t, root_rank))
        for h in handles:
            h.wait()


class _Sync:
    """The allreduce of an optimizer's gradients, in buckets of about bucket_bytes (one dtype
    each), every bucket in flight at once."""

    def __init__(self, comm, bucket_bytes):
        self.comm = comm
        self.bucket_bytes = bucket_bytes

    def params(self, optimizer):
        return [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]

    def run(self, optimizer):
        params = self.params(optimizer)
        for p in params:
            if p.grad is None:  # every rank must reduce the same tensors
                p.grad = torch.zeros_like(p)
        buckets, cur, cur_bytes = [], [], 0
        for p in params:
            nbytes = p.grad.numel() * p.grad.element_size()
            if cur and (cur_bytes + nbytes > self.bucket_bytes or cur[0].grad.dtype != p.grad.dtype):
                buckets.append(cur)
                cur, cur_bytes = [], 0
            cur.append(p)
            cur_bytes += nbytes
        if cur:
            buckets.append(cur)
        flights = []
        for b in buckets:
            flat = torch.cat([p.grad.reshape(-1) for p in b]) if len(b) > 1 else b[0].grad.reshape(-1).contiguous()
            flights.append((b, flat, self.comm.allreduce_async(flat, "sum")))
        for b, flat, h in flights:
            h.wait()
            flat.div_(self.comm.size)
            off = 0
            for p in b:
                n = p.grad.numel()
                p.grad.copy_(flat[off:off + n].view_as(p.grad))
                off += n


def DistributedOptimizer(optimizer, comm=None, bucket_bytes=25 << 20):
    """Horovod-style: the optimizer, whose step() first averages the gradients over every rank.
    The returned object is an instance of the optimizer's own class (LR schedulers and
    state_dict work), sharing its state; synchronize() does the averaging alone."""
    sync = _Sync(_comm_of(comm), bucket_bytes)
    base = optimizer.__class__

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        sync.run(self)
        base.step(self, None)
        return loss

    def synchronize(self):
        sync.run(self)

    cls = type("Distributed" + base.__name__, (base,), {"step": step, "synchronize": synchronize})
    dist_opt = cls.__new__(cls)
    dist_opt.__dict__ = optimizer.__dict__
    return dist_opt
