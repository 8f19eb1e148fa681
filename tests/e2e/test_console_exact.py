"""The console and `mltrain logs` (docs/spec.md, "Console output"): which one is exact, and the
order a rank wrote its stdout and stderr in, kept on the console, in rank-N.log and in `logs`."""
import json
import re
import subprocess
import time

from conftest import run_on_pty

N = 150
# Each line one write(2) of sh's builtin echo: stdout, then stderr, then stdout again ...
ALTERNATE = f'i=0; while [ $i -lt {N} ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done'
WRITTEN = [f"{s} {i}" for i in range(N) for s in ("out", "err")]

# Latin-1 text, invalid UTF-8, a raw C1 byte (CSI to an 8-bit terminal), a UTF-8 C1, an OSC title.
ODD = r'printf "caf\351 \377\376 \233y \302\233x \033]0;t\007 ok\n"'
ODD_BYTES = b"caf\xe9 \xff\xfe \x9by \xc2\x9bx \x1b]0;t\x07 ok\n"


def lines_of(text: str, rank: int):
    return [ln[len(f"[{rank}] "):] for ln in text.splitlines() if ln.startswith(f"[{rank}] ")]


def test_stdout_then_stderr_keep_the_order_the_rank_wrote_on_the_console_and_in_logs(ml):
    # The console's stdout and stderr are one pipe (2>&1), as in CI.
    p = ml.popen("run", "-n", "2", "--", "sh", "-c", ALTERNATE, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT)
    out = p.communicate(timeout=60)[0].decode(errors="replace")
    assert p.returncode == 0, out[-2000:]
    for rank in (0, 1):
        assert lines_of(out, rank) == WRITTEN, (rank, lines_of(out, rank)[:12])
    (run,) = ml.run_dirs()
    for rank in (0, 1):
        assert (run / f"rank-{rank}.log").read_text().splitlines() == WRITTEN, rank
    logs = ml("logs", "latest")
    assert logs.returncode == 0, logs.stderr
    for rank in (0, 1):
        assert lines_of(logs.stdout, rank) == WRITTEN, (rank, lines_of(logs.stdout, rank)[:12])


def test_the_order_is_kept_on_a_terminal_and_in_a_detached_run(ml):
    rc, out = run_on_pty(ml, ["run", "-n", "1", "--no-prefix", "--", "sh", "-c", ALTERNATE], timeout=60)
    assert rc == 0, out[-2000:]
    out = re.sub(rb"\x1b\[[0-9;]*[A-Za-z]", b"", out)  # a status line, should one be drawn
    shown = [ln.strip() for ln in out.decode(errors="replace").replace("\r", "").split("\n")]
    assert [ln for ln in shown if ln.startswith(("out ", "err "))] == WRITTEN, shown[:12]

    # Detached: no console at all, so the record is the one place the order has to be right.
    r = ml("run", "-d", "-n", "2", "--", "sh", "-c", ALTERNATE)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    deadline = time.monotonic() + 60
    while json.loads((ml.runs_dir / run_id / "run.json").read_text())["status"] == "running":
        assert time.monotonic() < deadline, "the detached run did not end"
        time.sleep(0.2)
    for rank in (0, 1):
        assert (ml.runs_dir / run_id / f"rank-{rank}.log").read_text().splitlines() == WRITTEN, rank
    logs = ml("logs", run_id, "--by-rank")
    for rank in (0, 1):
        assert lines_of(logs.stdout, rank) == WRITTEN, rank


def test_split_stdout_and_stderr_still_go_to_their_own_places_in_order(ml):
    r = ml("run", "-n", "2", "--", "sh", "-c", ALTERNATE)  # two pipes: stdout and stderr apart
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        assert lines_of(r.stdout, rank) == [f"out {i}" for i in range(N)]
        assert lines_of(r.stderr, rank) == [f"err {i}" for i in range(N)]


def test_piped_console_passes_bytes_but_no_control_code_and_logs_are_exact(ml):
    r = ml("run", "-n", "1", "--no-prefix", "--", "sh", "-c", ODD, text=False)
    assert r.returncode == 0, r.stderr
    # Not a terminal: Latin-1 and other invalid UTF-8 pass as written; control codes never do
    # (the raw C1 byte 0x9b, the UTF-8 C1 U+009B, ESC and BEL are escaped).
    assert r.stdout == b"caf\xe9 \xff\xfe \\x9by \\u{009b}x \\x1b]0;t\\x07 ok\n", r.stdout
    (run,) = ml.run_dirs()
    assert (run / "rank-0.log").read_bytes() == ODD_BYTES
    # `logs` into a pipe: the exact bytes.
    logs = ml("logs", "--no-prefix", "latest", text=False)
    assert logs.stdout == ODD_BYTES, logs.stdout
    # Its help says which one is exact.
    h = ml("logs", "--help")
    assert "exact bytes each rank wrote" in h.stdout and "The console itself is never exact" in h.stdout


def test_on_a_terminal_invalid_utf8_is_escaped_too(ml):
    rc, out = run_on_pty(ml, ["run", "-n", "1", "--no-prefix", "--", "sh", "-c", ODD])
    assert rc == 0, out
    assert b"caf\\xe9 \\xff\\xfe \\x9by \\u{009b}x \\x1b]0;t\\x07 ok" in out, out
    assert b"\xe9" not in out and b"\x1b]" not in out and b"\x9b" not in out, out
    rc, out = run_on_pty(ml, ["logs", "--no-prefix", "latest"])
    assert rc == 0 and b"caf\\xe9 \\xff\\xfe" in out and b"\x07" not in out, out
