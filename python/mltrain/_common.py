"""What mltrain (collectives) and mltrain.ps (parameter servers) share: how an async operation's
handle ends, and the process's one communicator or client."""
import atexit
import threading


class Handle:
    """An operation started by an *_async call. wait() returns its result (the output array; None
    for a push) or raises its CommError; done() says whether wait() would return at once. The
    arrays stay referenced until it is done.

    A subclass says how the operation ends: _settle() (called by wait() and exception()) waits for
    it where that takes an action of the caller's, _finished() is called once it has ended, and
    _first_callback() when a callback is added to an operation still running."""

    def __init__(self, result):
        self._result = result
        self._error = None
        self._done = threading.Event()
        self._callbacks = []
        self._cb_lock = threading.Lock()

    def _settle(self):
        pass

    def _first_callback(self):
        pass

    def _run_callback(self, cb):
        cb(self)

    def _finished(self, error=None):
        """Records how the operation ended and runs the callbacks added so far."""
        self._error = error
        with self._cb_lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            self._run_callback(cb)

    def done(self):
        return self._done.is_set()

    def wait(self, timeout=None):
        """Blocks until the operation is done (at most `timeout` seconds: TimeoutError after); returns
        its result, or raises its CommError."""
        self._settle()
        if not self._done.wait(timeout):
            raise TimeoutError("the operation is still running")
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self):
        """Waits, then returns the operation's error (None when it succeeded)."""
        self._settle()
        self._done.wait()
        return self._error

    def add_done_callback(self, cb):
        """cb(handle) runs once the operation is done: on the thread that finishes it, or at once
        when it already is."""
        with self._cb_lock:
            if self._done.is_set():
                first = None
            else:
                self._callbacks.append(cb)
                first = len(self._callbacks) == 1
        if first is None:
            cb(self)
        elif first:
            self._first_callback()


class ProcessDefault:
    """The process's one instance of a class (a communicator, a client): made by init(), closed by
    shutdown() and at exit; init() after shutdown() makes a new one."""

    def __init__(self, make, not_initialized):
        self._make = make
        self._not_initialized = not_initialized
        self._value = None
        self._lock = threading.Lock()

    def init(self):
        with self._lock:
            if self._value is None:
                self._value = self._make()
                atexit.register(self.shutdown)
            return self._value

    def is_initialized(self):
        return self._value is not None

    def shutdown(self):
        with self._lock:
            if self._value is not None:
                self._value.close()
                self._value = None

    def get(self):
        value = self._value
        if value is None:
            raise ValueError(self._not_initialized)
        return value
