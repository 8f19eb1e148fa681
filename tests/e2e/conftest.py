"""Shared fixtures for the end-to-end tests that drive the built `mltrain` binary.

Every test gets its own MLTRAIN_HOME, XDG_CONFIG_HOME and working directory under tmp_path, so
run records never mix. Every subprocess has a timeout: a hang fails the test instead of CI.
"""
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT = 30


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than ~10 s (flood, grace-period timing)")
    config.addinivalue_line("markers", "smoke: the quick tier's local set (scripts/test.sh --quick)")
    config.addinivalue_line("markers", "cluster: needs the test cluster (set on every test that uses it)")
    config.addinivalue_line("markers", "asan: also run against the ASan+UBSan build (the ASAN list)")
    config.addinivalue_line("markers", "alone: needs the whole machine; runs after the parallel part, alone")


# The quick tier's e2e set (`pytest -m smoke`, scripts/test.sh --quick): one or two fast local tests
# of each main path, about 40 s in all. Listed here, in one place, rather than marked in each module.
SMOKE = {
    "test_basic.py::test_four_ranks_print_their_env",
    "test_basic.py::test_examples_hello_runs",
    "test_basic.py::test_dry_run_json_plan",
    "test_spec_errors.py::test_good_spec_validates",
    "test_cli_edges.py::test_hosts_without_counts_have_one_slot",
    "test_failures.py::test_segfault_names_sigsegv",
    "test_failures.py::test_restart_from_spec",
    "test_failures.py::test_sigkill_of_launcher_leaves_no_rank[normal]",
    "test_lifecycle.py::test_rank_exit_code_above_128",
    "test_records.py::test_run_json_stdout_is_only_json",
    "test_records.py::test_logs_follow_of_a_finished_run_ends",
    "test_output.py::test_partial_last_line_is_kept",
    "test_live_output.py::test_stdin_goes_to_rank_0_only",
    "test_early_signals.py::test_signal_while_connecting_starts_nothing[INT]",
    "test_escapes.py::test_nothing_escapes_locally[normal-0]",
    "test_shm_cleanup.py::test_no_shared_memory_left[rank-sigkill]",
    "test_sync.py::test_a_local_run_syncs_runs_in_the_copy_and_pulls_back",
    "test_telemetry.py::test_interval_zero_records_no_telemetry",
    "test_secrets.py::test_secret_values_reach_ranks_but_no_record_or_printout",
    "test_knobs.py::test_table_is_aligned_and_lists_the_comm_knobs",
    "test_comm_faults.py::test_killed_rank_named_by_all_local",
    "test_bench.py::test_bench_table_with_check",
    "test_python_ps.py::test_async_sgd_example_converges",
    "test_gpus.py::test_each_rank_gets_its_gpus[all-four]",
    "test_nccl.py::test_auto_falls_back_to_the_cpu_backend_with_one_line_when_nccl_does_not_load",
    "test_state_disk.py::test_read_only_home_is_a_clean_error",
}


# MLTRAIN_E2E_SANITIZED=1: the binary under test (and the agent inside it) is an ASan+UBSan build
# (scripts/test.sh's "e2e under ASan+UBSan" stage runs `pytest -m asan` so); any report fails the test.
SANITIZED = os.environ.get("MLTRAIN_E2E_SANITIZED") == "1"

# The tests that run with the sanitized launcher and agent (`-m asan`): the local gang, a restart,
# a crash, sync and pull, output and stdin through the agent, the bench (the comm runtime, its
# stats blocks) in both modes (PS mode: the agent's parameter servers), a hostile host's pull, the
# heartbeat timers. (Python ranks cannot load the sanitized comm library: no ASan runtime first.)
ASAN = {
    "test_basic.py::test_four_ranks_print_their_env",
    "test_failures.py::test_restart_from_spec",
    "test_failures.py::test_segfault_names_sigsegv",
    "test_sync.py::test_a_local_run_syncs_runs_in_the_copy_and_pulls_back",
    "test_output.py::test_partial_last_line_is_kept",
    "test_live_output.py::test_stdin_goes_to_rank_0_only",
    "test_bench.py::test_bench_table_with_check",
    "test_bench.py::test_bench_ps_mode_through_the_agents_servers",
    "test_adversarial_pull.py::test_names_that_leave_the_folder_are_refused_and_nothing_lands_outside",
    "test_heartbeats.py::test_a_stopped_agent_is_lost_after_the_heartbeat_timeout",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks set here
def pytest_collection_modifyitems(config, items):
    # `-m "not cluster"` is the local set: every test on a cluster says so by its fixtures.
    seen = set()
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
            # Under pytest-xdist (--dist loadgroup) every cluster test runs on one worker, in
            # order: there is one cluster per machine (fixed namespace names).
            item.add_marker(pytest.mark.xdist_group("cluster"))
        nodeid = item.nodeid.split("tests/e2e/", 1)[-1]
        if nodeid in SMOKE:
            item.add_marker(pytest.mark.smoke)
            seen.add(nodeid)
        if nodeid in ASAN:
            item.add_marker(pytest.mark.asan)
            seen.add(nodeid)
    # A renamed or removed smoke test must not leave the quick tier quietly smaller.
    # (Of the modules collected, or whose file is gone: a run of one module checks only that one.)
    modules = {item.nodeid.split("tests/e2e/", 1)[-1].split("::")[0] for item in items}
    here = Path(__file__).parent
    for name, listed in (("smoke", SMOKE), ("asan", ASAN)):
        if name in (config.getoption("markexpr") or ""):
            if missing := sorted(t for t in listed - seen
                                 if t.split("::")[0] in modules or not (here / t.split("::")[0]).exists()):
                raise pytest.UsageError(f"{name} tests not collected (renamed? update {name.upper()} in "
                                        "conftest.py): " + ", ".join(missing))


@pytest.fixture(autouse=True)
def _cluster_faults_undone(request):
    """After a test on the test cluster: the hosts it cut, killed, rekeyed or made unknown are
    healed, revived and trusted again, so the next test starts from a whole cluster."""
    yield
    if "cluster" in request.fixturenames:
        c = request.getfixturevalue("cluster")
        if hasattr(c, "undo_faults"):
            c.undo_faults()


def pytest_sessionfinish(session, exitstatus):
    # The session's one test cluster (multihost_fixtures.module_cluster) goes down with it.
    fixtures = sys.modules.get("multihost_fixtures")
    if fixtures is not None:
        fixtures.down_session_cluster()


def _wait_for_binary(path: Path, wait_s: float = 180.0) -> Path:
    # Another engineer may be relinking build/mltrain: it can be missing for a moment.
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            st = path.stat()
            # Present, executable, not a half-written link output, and not changed just now.
            if (os.access(path, os.X_OK) and st.st_size > 1_000_000
                    and time.time() - st.st_mtime > 2.0):
                return path
        except OSError:
            pass
        time.sleep(1.0)
    pytest.exit(f"mltrain binary not found at {path} (build it, or set MLTRAIN_BIN)", returncode=4)


@pytest.fixture(scope="session")
def mltrain_bin(tmp_path_factory) -> Path:
    """A private copy of the binary, so a concurrent rebuild cannot swap it mid-suite."""
    src = Path(os.environ.get("MLTRAIN_BIN", REPO / "build" / "mltrain"))
    if not src.is_absolute():
        src = REPO / src
    src = _wait_for_binary(src)
    dst = tmp_path_factory.mktemp("bin") / "mltrain"
    for attempt in range(30):
        try:
            shutil.copy2(src, dst)
            break
        except (FileNotFoundError, OSError):
            time.sleep(1.0)
            _wait_for_binary(src)
    dst.chmod(0o755)
    return dst


def unique_marker() -> str:
    """A sleep duration no other process on the machine uses: '9' and 7 random digits."""
    return "9" + "".join(random.choice("0123456789") for _ in range(7))


def live_pids_with(proc_file: str, item: bytes):
    """Pids of live processes whose /proc/PID/<proc_file> (cmdline or environ: NUL-separated)
    holds `item` as a whole entry. Zombies are already dead; their parent just has not reaped them."""
    me = os.getpid()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/{proc_file}", "rb") as f:
                entries = f.read().split(b"\0")
            with open(f"/proc/{d}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and item in entries:
            found.append(int(d))
    return found


def pids_with_arg(marker: str):
    """Pids of live processes whose argv holds `marker` as a whole argument (scanning /proc)."""
    return live_pids_with("cmdline", marker.encode())


def wait_gone(marker: str, within_s: float) -> list:
    """Waits until no process carries `marker`; returns the pids still alive after within_s."""
    deadline = time.monotonic() + within_s
    while True:
        left = pids_with_arg(marker)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


class Mltrain:
    """Runs the binary with an isolated environment rooted at tmp_path."""

    def __init__(self, binary: Path, tmp_path: Path):
        self.bin = str(binary)
        self.dir = tmp_path
        self.home = tmp_path / "home"
        self.config = tmp_path / "config"
        self.home.mkdir()
        self.config.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLTRAIN_", "SLURM_"))}
        env.pop("NO_COLOR", None)
        # Each test's jobs contend for GPUs and queue places with each other only: tests that run
        # at once (pytest-xdist) share this machine's fake GPUs (docs/sharing.md, spaces).
        self.lease_space = "t-" + uuid.uuid4().hex[:24]
        env.update(MLTRAIN_HOME=str(self.home), XDG_CONFIG_HOME=str(self.config),
                   XDG_STATE_HOME=str(tmp_path / "state"), LC_ALL="C.UTF-8", MLTRAIN_LEASE_SPACE=self.lease_space)
        self.sanitizer_logs = None
        if SANITIZED:
            # Every sanitized process (the launcher, its agents, the bench) writes its reports
            # here, whatever became of its stderr; cleanup() fails the test on any report.
            self.sanitizer_logs = tmp_path / "sanitizer-reports"
            self.sanitizer_logs.mkdir()
            env.update(ASAN_OPTIONS=f"detect_leaks=1:log_path={self.sanitizer_logs}/asan",
                       UBSAN_OPTIONS=f"print_stacktrace=1:halt_on_error=1:log_path={self.sanitizer_logs}/ubsan")
        self.env = env
        self.markers = []
        self.procs = []

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def run_dirs(self):
        if not self.runs_dir.exists():
            return []
        # As mltrain lists them: a hidden folder is a run being made (records::create_run).
        return sorted(p for p in self.runs_dir.iterdir() if p.is_dir() and not p.name.startswith("."))

    def marker(self) -> str:
        m = unique_marker()
        self.markers.append(m)
        return m

    def _env(self, env=None, unset=()):
        e = dict(self.env)
        if env:
            e.update(env)
        for k in unset:
            e.pop(k, None)
        return e

    def __call__(self, *args, timeout=DEFAULT_TIMEOUT, env=None, unset=(), text=True, input=None,
                 cwd=None):
        """Runs `mltrain ARGS...` to completion; a hang past `timeout` fails the test."""
        try:
            return subprocess.run([self.bin, *map(str, args)], env=self._env(env, unset),
                                  cwd=str(cwd or self.dir), capture_output=True, text=text,
                                  input=input, timeout=timeout,
                                  **({"errors": "replace"} if text else {}))
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"mltrain {' '.join(map(str, args))} did not finish within {timeout}s; "
                        f"stdout={e.stdout!r:.2000} stderr={e.stderr!r:.2000}")

    def popen(self, *args, env=None, unset=(), cwd=None, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        p = subprocess.Popen([self.bin, *map(str, args)], env=self._env(env, unset),
                             cwd=str(cwd or self.dir), **kw)
        self.procs.append(p)
        return p

    def write(self, name: str, text: str) -> Path:
        p = self.dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            try:
                p.communicate(timeout=5)
            except Exception:
                pass
        # Anything a test left behind carries one of its markers: kill exactly those pids.
        for m in self.markers:
            for pid in pids_with_arg(m):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def sanitizer_reports(self) -> str:
        """What the sanitizers reported in this test (MLTRAIN_E2E_SANITIZED=1), '' when nothing."""
        if self.sanitizer_logs is None:
            return ""
        return "".join(f"== {p.name}\n{p.read_text(errors='replace')[:20000]}"
                       for p in sorted(self.sanitizer_logs.iterdir()))


@pytest.fixture
def ml(mltrain_bin, tmp_path):
    m = Mltrain(mltrain_bin, tmp_path)
    yield m
    m.cleanup()
    if reports := m.sanitizer_reports():
        pytest.fail("the sanitizers reported errors:\n" + reports, pytrace=False)


def communicate(p: subprocess.Popen, timeout: float):
    """Popen.communicate that fails the test (and kills the launcher) on a hang."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate(timeout=10)
        pytest.fail(f"mltrain did not finish within {timeout}s; stdout={out[-2000:]!r} "
                    f"stderr={err[-2000:]!r}")
    if isinstance(out, bytes):
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
    return out, err


def work_dir(home: Path, project: str) -> Path:
    """The folder a sync of the project folder named `project` made under `home` (the default
    ~/.cache/mltrain/work/<project>-<8 hex of its key>), the newest of that name; a path that does
    not exist when none."""
    found = (Path(home) / ".cache" / "mltrain" / "work").glob(project + "-" + "[0-9a-f]" * 8)
    # A home that outlives the test session (the cluster's shared one) may hold a folder of the
    # same name synced from another path earlier: the one synced last is this test's.
    newest = max(found, key=lambda p: p.stat().st_mtime, default=None)
    return newest or Path(home) / ".cache" / "mltrain" / "work" / (project + "-none")


def wait_for(pred, timeout: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def run_on_pty(ml, args, env=None, timeout=15):
    """Runs mltrain with stdout and stderr on a pseudo-terminal; returns (rc, bytes printed)."""
    import pty
    import select
    master, slave = pty.openpty()
    p = subprocess.Popen([ml.bin, *map(str, args)], stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, env=ml._env(env), cwd=str(ml.dir))
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.1)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    try:
        rc = p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"mltrain on a pty did not finish: {out[-500:]!r}")
    return rc, out
