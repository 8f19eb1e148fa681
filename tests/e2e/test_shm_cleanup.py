"""/dev/shm holds nothing of a job once it ends, however its ranks died: the ranks' shared memory
(ring segments and each rank's bell) is named after the run, and the job's agent removes what
killed ranks leave behind. Ranks run the comm benchmark (4 ranks, shared memory links), ended by
Ctrl-C, by the launcher's SIGKILL, or by one rank's SIGKILL in mid-allreduce."""
import os
import signal
import time

import pytest

from conftest import communicate, wait_for

# Rank 1 kills itself (its process: the benchmark replaced the shell) when $D/kill appears.
WORKER = ('if [ "$RANK" = 1 ]; then ( while [ ! -e "$D/kill" ]; do sleep 0.05; done; kill -9 $$ ) & fi; '
          'exec "$MLTRAIN_RUNTIME/bin/mltrain-comm-bench" -b 4M -e 4M --iters 1000000 --warmup 0')


def _ours():
    return {n for n in os.listdir("/dev/shm") if n.startswith("mltrain-")}


@pytest.mark.parametrize("ending", ["ctrl-c", "launcher-sigkill", "rank-sigkill"])
def test_no_shared_memory_left(ml, tmp_path, ending):
    before = _ours()
    d = tmp_path / "d"
    d.mkdir()
    p = ml.popen("run", "-n", "4", "--grace-period", "1s", "--env", "MLTRAIN_COMM_TIMEOUT=5s",
                 "--env", f"D={d}", "--", "sh", "-c", WORKER, text=True)
    try:
        # Inside the timed loop: every rank has joined and mapped its ring neighbours' memory.
        def in_loop():
            logs = list(ml.runs_dir.glob("*/rank-0.log"))
            return logs and "# iters" in logs[0].read_text(errors="replace")
        wait_for(in_loop, 60, "rank 0 to reach the benchmark loop")
        time.sleep(0.5)
        during = _ours() - before
        assert during, "the ranks use no shared memory: this test checks nothing"
        if ending == "ctrl-c":
            p.send_signal(signal.SIGINT)
        elif ending == "launcher-sigkill":
            p.kill()
        else:
            (d / "kill").touch()
        communicate(p, 60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    wait_for(lambda: not (_ours() - before), 5, "the job's /dev/shm entries to be removed")
