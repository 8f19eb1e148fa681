"""mltrain.log: a rank's scalars into its run's metrics.jsonl (docs/metrics.md).

    import mltrain
    for step in range(steps):
        loss = train_step()
        mltrain.log(step=step, loss=loss, lr=sched.get_last_lr()[0])

No init, no comm library: under `mltrain run` each rank has a pipe to its agent (its descriptor in
MLTRAIN_METRICS_FD) and log() hands the values to a writer thread, which turns them into JSON
lines and writes them in batches. log() never waits on that pipe: when the writer falls behind by
more than MAX_PENDING records, the newest are dropped (and counted). Values are turned into floats
on the writer thread, so a torch tensor may be passed as it is. Outside `mltrain run` log() does
nothing.
"""
import atexit
import collections
import json
import math
import os
import stat
import sys
import threading

from . import _env

__all__ = ["log", "flush"]

MAX_PENDING = 100_000  # records waiting for the writer thread, at most
_INTERVAL = 0.2        # seconds between the writer's batches

_state = None  # this process's _Channel, or False outside mltrain run; None until the first log()
_lock = threading.Lock()


class _Channel:
    def __init__(self, fd):
        self.fd = fd
        self.pending = collections.deque()
        self.step = -1
        self.dropped = 0
        self.wake = threading.Event()
        self.writing = threading.Lock()  # flush() and the thread: one batch at a time
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="mltrain-metrics", daemon=True)
        self.thread.start()

    def _run(self):
        while not self.closed:
            self.wake.wait(_INTERVAL)
            self.wake.clear()
            self.write()

    def write(self):
        with self.writing:
            self._write()

    def _write(self):
        items = []
        pending = self.pending
        while pending:
            items.append(pending.popleft())
        if not items or self.fd < 0:
            return
        lines = []
        for step, scalars in items:
            rec = {"step": step}
            for k, v in scalars.items():
                try:
                    f = float(v)
                except (TypeError, ValueError):
                    continue
                rec[k] = f if math.isfinite(f) else None
            lines.append(json.dumps(rec, separators=(",", ":")))
        data = ("\n".join(lines) + "\n").encode()
        try:
            while data:
                n = os.write(self.fd, data)
                data = data[n:]
        except OSError:  # the agent is gone: nothing more can land
            self.fd = -1

    def close(self):
        self.closed = True
        self.wake.set()
        self.thread.join(5.0)
        self.write()
        if self.dropped:
            sys.stderr.write("mltrain.log: %d records were dropped (the writer fell behind)\n" % self.dropped)


def _channel():
    global _state
    with _lock:
        if _state is None:
            _state = False
            fd = _env.metrics_fd()
            try:
                if fd is not None and stat.S_ISFIFO(os.fstat(fd).st_mode):
                    _state = _Channel(fd)
                    atexit.register(_state.close)
            except OSError:
                pass
        return _state


def _forget_after_fork():
    # A forked child (a DataLoader worker) has no writer thread: it starts its own if it logs.
    global _state, _lock
    _lock = threading.Lock()
    _state = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def log(step=None, **scalars):
    """Records scalars (numbers, or anything float() takes, such as a one-element tensor) at
    `step`, an int >= 0; without one, the step after this process's last. Never blocks."""
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int):
            step = int(step)  # a numpy integer, say
        if step < 0:
            raise ValueError("mltrain.log: step must be >= 0, not %d" % step)
    ch = _state if _state is not None else _channel()
    if not ch:
        return
    if step is None:
        step = ch.step + 1
    ch.step = step
    if len(ch.pending) >= MAX_PENDING:
        ch.dropped += 1
        return
    ch.pending.append((step, scalars))


def flush():
    """Hands everything logged so far to the pipe now (the writer does it every 0.2 s anyway)."""
    ch = _state if _state is not None else _channel()
    if ch:
        ch.write()
