"""Issue 31: another local user on a host (played by `nobody`) against a job's agent and ranks.

What they can see: run ids (in /dev/shm names), /dev/shm and /tmp, the job's ports. What they must
not be able to do: make an agent spin or a job fail through a file named like a comm counter block
(item 4), have their file printed as a rank's error (item 11), grow a PS log without bound (13).
Runs as root (to become nobody); skipped otherwise."""
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from conftest import communicate, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays another local user (nobody): needs root")

NOBODY = 65534
MAGIC, VERSION = 0x5453544D, 2

# As nobody: a 4 KiB file at /dev/shm/NAME that looks like a rank's counter block (valid magic and
# version), whose clock seqlock stays odd forever: a reader that retries without bound spins.
HOSTILE_BLOCK = r"""
import os, struct, sys
name, pid, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3], 8)
head = struct.pack("<IIiiiIQQQQ", 0x5453544D, 2, 0, 1, pid, 0, 1, 0, 0, 1 << 32)
fd = os.open("/dev/shm/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
os.fchmod(fd, mode)
os.write(fd, head + b"\0" * (4096 - len(head)))
os.close(fd)
"""


def _as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def plant_block(name, pid, mode="644"):
    subprocess.run([sys.executable, "-c", HOSTILE_BLOCK, name, str(pid), mode], check=True, timeout=30,
                   preexec_fn=_as_nobody)
    path = "/dev/shm/" + name
    assert os.stat(path).st_uid == NOBODY
    return path


def run_doc(ml):
    dirs = ml.run_dirs()
    if not dirs or not (dirs[-1] / "run.json").exists():
        return None
    try:
        doc = json.loads((dirs[-1] / "run.json").read_text())
    except ValueError:
        return None  # being written
    return doc if doc.get("ranks") else None


def run_id_of(ml):
    doc = wait_for(lambda: run_doc(ml), 60, "the run record")
    return doc["ranks"][0]["env"]["MLTRAIN_RUN_ID"], ml.run_dirs()[-1]


def telemetry_lines(run_dir):
    try:
        return (run_dir / "telemetry.jsonl").read_text().count("\n")
    except OSError:
        return 0


def shm_names(prefix):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


# --- item 4: comm counter blocks ----------------------------------------------------------------

def test_a_strangers_stats_block_does_not_hang_the_agent_or_fail_the_job(ml, tmp_path):
    # The ranks wait for `done`: the job runs while the hostile block sits at rank 0's old name and
    # the agent samples every 200 ms. Before the fix the agent spun in the seqlock read and the
    # launcher lost its heartbeats (the job failed with "stopped answering heartbeats").
    done = tmp_path / "done"
    job = ml.popen("run", "-n", "2", "--max-restarts", "0", "--", "sh", "-c",
                   f"until [ -e {done} ]; do sleep 0.05; done",
                   env={"MLTRAIN_TELEMETRY_INTERVAL": "200ms"})
    planted = []
    try:
        run_id, run_dir = run_id_of(ml)
        for rank in range(2):
            planted.append(plant_block(f"mltrain-{run_id}-stats-{rank}", 1))
        before = telemetry_lines(run_dir)
        # Samples keep coming (the agent is not stuck) well past the heartbeat window (10 s).
        wait_for(lambda: job.poll() is not None or telemetry_lines(run_dir) >= before + 20, 120,
                 "20 more telemetry samples")
        assert job.poll() is None, communicate(job, 30)
        done.touch()
        out, err = communicate(job, 60)
        assert job.returncode == 0, err[-3000:]
        assert "heartbeat" not in err, err[-3000:]
        for p in planted:  # nothing of the stranger's is removed
            assert os.stat(p).st_uid == NOBODY, p
    finally:
        done.touch()
        for p in planted:
            if os.path.exists(p):
                os.unlink(p)


def test_top_on_a_host_with_a_strangers_stats_block_answers_and_names_it_once(ml):
    # Watch mode reads every block in /dev/shm: a stranger's (pid 1 is alive) is named once and
    # ignored. Before the fix the watching agent spun and `top` lost the host.
    name = f"mltrain-stranger{os.getpid()}-stats-0"
    path = plant_block(name, 1)
    try:
        r = ml("top", "--once", "--json", "-i", "300ms", timeout=90)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "heartbeat" not in r.stderr, r.stderr[-3000:]
        said = (r.stdout + r.stderr).count(f"ignoring /dev/shm/{name}")
        assert said == 1, r.stdout[-2000:] + r.stderr[-2000:]
        assert "owned by uid 65534" in r.stdout + r.stderr
        assert os.path.exists(path)
    finally:
        os.unlink(path)


def test_a_strangers_file_at_a_ranks_stats_name_neither_fails_the_rank_nor_is_removed(ml, tmp_path):
    # Ranks that run the comm library start once the stranger's files sit at the names a rank
    # without the agent's name would use; ranks also get their agent's unguessable name. Before
    # the fix a rank running as root removed the stranger's file (shm_unlink) to make its own.
    go = tmp_path / "go"
    worker = (f'until [ -e {go} ]; do sleep 0.05; done; '
              'exec "$MLTRAIN_RUNTIME/bin/mltrain-comm-bench" -b 4K -e 4K --iters 50 --warmup 0 --check')
    job = ml.popen("run", "-n", "2", "--", "sh", "-c", worker, env={"MLTRAIN_TELEMETRY_INTERVAL": "200ms"})
    planted = []
    try:
        run_id, run_dir = run_id_of(ml)
        for rank in range(2):
            planted.append(plant_block(f"mltrain-{run_id}-stats-{rank}", 1, "600"))
        go.touch()
        out, err = communicate(job, 120)
        assert job.returncode == 0, err[-3000:]
        table = [ln for ln in out.splitlines() if ln.startswith("[0]") and "4096" in ln]
        assert table and table[-1].split()[-1] == "0", out[-2000:]  # #wrong
        for p in planted:
            assert os.path.exists(p) and os.stat(p).st_uid == NOBODY, p
        # The job's own blocks had names of their own, and are gone with the job.
        assert shm_names(f"mltrain-{run_id}-") == sorted(os.path.basename(p) for p in planted)
    finally:
        go.touch()
        for p in planted:
            if os.path.exists(p):
                os.unlink(p)


# --- item 11: TORCHELASTIC_ERROR_FILE of a remote rank ------------------------------------------

FAKE_SRUN = """#!/bin/sh
# srun as the Slurm transport calls it, run here: options dropped, the step's command run.
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
exec "$@"
"""


def remote_here(ml, tmp_path):
    """Flags and env that make this machine a remote host: the Slurm transport with a fake srun,
    so the plan gives ranks the remote form of TORCHELASTIC_ERROR_FILE and the agent places it."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "SLURM_JOB_ID": "4242"}
    return ["--launcher", "slurm", "-H", socket.gethostname()], env


def test_a_strangers_error_file_is_never_shown_or_removed_and_the_ranks_own_folder_is_private(ml, tmp_path):
    # Before the fix a remote rank's error file was /tmp/mltrain-<run>-rank-N.error.json: another
    # user made one first, the launcher printed it as the rank's error (a raw OSC escape with it)
    # and the agent removed it afterwards.
    flags, env = remote_here(ml, tmp_path)
    go = tmp_path / "go"
    seen = tmp_path / "seen"
    script = (f'echo "$TORCHELASTIC_ERROR_FILE" > {seen}; until [ -e {go} ]; do sleep 0.05; done; '
              'd=$(dirname "$TORCHELASTIC_ERROR_FILE"); stat -c "%a %u" "$d" >> ' + str(seen) + '; '
              'if [ "$RANK" = 0 ]; then printf \'{"message": {"message": "RANK0-OWN \\033]0;t\\007", '
              '"extraInfo": {}}}\' > "$TORCHELASTIC_ERROR_FILE"; exit 3; fi; exit 3')
    job = ml.popen("run", *flags, "--", "sh", "-c", script, env=env)
    stranger = None
    try:
        run_id, _ = run_id_of(ml)
        stranger = f"/tmp/mltrain-{run_id}-rank-0.error.json"
        subprocess.run([sys.executable, "-c",
                        "import sys; open(sys.argv[1], 'w').write("
                        "'{\"message\": {\"message\": \"STRANGER \\x1b]0;pwned\\x07\", \"extraInfo\": {}}}')",
                        stranger], check=True, preexec_fn=_as_nobody, timeout=30)
        go.touch()
        out, err = communicate(job, 120)
        assert job.returncode != 0, err[-3000:]
        assert "STRANGER" not in out + err, err[-3000:]
        assert "RANK0-OWN" in err, err[-3000:]
        assert "\x1b]" not in err, repr(err[-3000:])  # the rank's text is escaped on the terminal
        # Where it was: a folder of the agent's own, 0700, that no other user could have guessed,
        # and that is gone with the run.
        path, mode = seen.read_text().split("\n")[:2]
        folder = os.path.dirname(path)
        assert folder.startswith(f"/tmp/mltrain-{run_id}-") and folder != "/tmp", path
        assert mode == "700 0", mode
        wait_for(lambda: not os.path.exists(folder), 30, "the agent's private folder to be removed")
        # The stranger's file is theirs: neither read nor removed.
        assert os.stat(stranger).st_uid == NOBODY
    finally:
        go.touch()
        if stranger and os.path.exists(stranger):
            os.unlink(stranger)


def test_a_ranks_error_file_that_is_a_link_or_not_ours_is_not_read(ml, tmp_path):
    # The agent reads only a regular file of the job's user, never through a link: a rank's error
    # file replaced by a link to a secret, or by another user's file, is not shown.
    secret = tmp_path / "secret"
    secret.write_text('{"message": {"message": "SECRET-CONTENT", "extraInfo": {}}}')
    script = ('if [ "$RANK" = 0 ]; then ln -sf ' + str(secret) + ' "$TORCHELASTIC_ERROR_FILE"; '
              'else printf \'{"message": {"message": "NOT-OURS", "extraInfo": {}}}\' > "$TORCHELASTIC_ERROR_FILE"; '
              'chown 65534 "$TORCHELASTIC_ERROR_FILE"; fi; exit 3')
    r = ml("run", "-n", "2", "--", "sh", "-c", script, timeout=60)
    assert r.returncode != 0
    assert "SECRET-CONTENT" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert "NOT-OURS" not in r.stdout + r.stderr, r.stderr[-3000:]
    assert secret.exists()


# --- item 13: strangers flooding a PS server's log ----------------------------------------------

FLOOD_PS = r"""
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sent = 0
for i in range(n):
    try:
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 16)  # not a PS hello: refused at once
        s.close()
        sent += 1
    except OSError:
        pass
print("sent", sent, flush=True)
"""


def test_strangers_flooding_a_ps_server_do_not_grow_its_log(ml, tmp_path):
    # Before the fix each refused connection was one line of ps-<host>.log: 20,000 in 5.8 s.
    done = tmp_path / "done"
    spec = ml.write("ps_flood.toml", f'''
[run]
argv = ["sh", "-c", "until [ -e {done} ]; do sleep 0.05; done"]
timeout = "5m"
[cluster]
procs_per_host = 1
[ps]
servers_per_host = 1
''')
    job = ml.popen("run", spec)
    try:
        def ps_address():
            doc = run_doc(ml)
            return doc and doc.get("ps_servers") and doc["ps_servers"][0].get("address")
        host, port = wait_for(ps_address, 60, "the PS server in the run record").rsplit(":", 1)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-c", FLOOD_PS, host, port, "20000"], capture_output=True,
                           text=True, timeout=300, preexec_fn=_as_nobody)
        flood_s = time.monotonic() - t0
        assert r.stdout.startswith("sent "), r.stdout + r.stderr
        assert int(r.stdout.split()[1]) >= 19000, r.stdout
        done.touch()
        out, err = communicate(job, 120)
        assert job.returncode == 0, err[-3000:]
        logs = list(ml.run_dirs()[-1].glob("ps-*.log"))
        assert len(logs) == 1, logs
        lines = logs[0].read_text().splitlines()
        refusals = [l for l in lines if "not an mltrain PS worker" in l]
        # A few in full per 10 s window (5) and a summary of the rest (which names the last one):
        # quiet, the flood fits in one or two windows (12 lines at most); loaded, it lasts longer,
        # never more than 6 lines a window (77 s of flood gave 48 lines).
        windows = int(flood_s // 10) + 2
        assert len(refusals) <= max(12, 6 * windows), f"{len(refusals)} lines in {flood_s:.0f} s, e.g. {refusals[:3]}"
        summaries = [l for l in lines if "more refused connections" in l]
        assert summaries, lines[-10:]
        counted = sum(int(l.split("more refused")[0].split()[-1]) for l in summaries)
        assert counted + len(refusals) - len(summaries) >= 19000, (counted, len(refusals))
    finally:
        done.touch()
