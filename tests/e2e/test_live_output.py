"""Live output (partial lines, `\\r` progress, escaping) and --stdin, on localhost."""
import os
import pty
import re
import select
import subprocess
import time

from conftest import communicate

# Three progress states ~0.4 s apart, then the line ends: what tqdm does.
PROGRESS = 'for i in 1 2 3; do printf "\\r%s%%|##" $((i*30)); sleep 0.4; done; echo'


def read_until(fd, pred, timeout):
    """Reads from fd until pred(bytes so far) or timeout; returns what was read."""
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not pred(got):
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
    return got


def plain(b: bytes) -> bytes:
    return re.sub(rb"\x1b\[[0-9;]*m", b"", b)


def run_on_pty(ml, *args, stdin=subprocess.DEVNULL):
    """Starts mltrain with its stdout on a pseudo-terminal; returns (process, master fd)."""
    master, slave = pty.openpty()
    p = ml.popen(*args, stdout=slave, stderr=subprocess.PIPE, stdin=stdin)
    os.close(slave)
    return p, master


# Waits (at most 20 s) until the test creates the file $GO.
WAIT_GO = 'i=0; while [ ! -e "$GO" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done'


def test_partial_line_reaches_the_console_before_its_newline(ml, tmp_path):
    go = tmp_path / "go"
    p = ml.popen("run", "-n", "1", "--env", f"GO={go}", "--", "sh", "-c",
                 f'printf "ready> "; {WAIT_GO}; echo done')
    got = read_until(p.stdout.fileno(), lambda b: b"ready>" in b, 15.0)
    assert b"[0] ready> " in got, f"nothing shown while the rank waits for its newline: {got!r}"
    assert p.poll() is None
    go.touch()
    out, err = communicate(p, 30)
    assert p.returncode == 0, err
    # The rest continues the line: one line, one prefix.
    assert (got.decode() + out).splitlines()[0] == "[0] ready> done"


def test_progress_on_a_terminal_is_a_live_status_line_per_rank(ml, tmp_path):
    go = tmp_path / "go"
    p, master = run_on_pty(ml, "run", "-n", "2", "--env", f"GO={go}", "--", "sh", "-c",
                           f'printf "\\r30%%|##"; {WAIT_GO}; {PROGRESS}')
    try:
        live = plain(read_until(master, lambda b: b"[0] 30%|##" in plain(b) and b"[1] 30%|##" in plain(b),
                                15.0))
        assert b"[0] 30%|##" in live and b"[1] 30%|##" in live, f"no live status lines: {live!r}"
        assert p.poll() is None, "the progress was only shown at the end"
        go.touch()
        rest = plain(read_until(master, lambda b: False, 15.0))
    finally:
        os.close(master)
    _, err = communicate(p, 30)
    assert p.returncode == 0, err
    screen = (live + rest).decode()
    # The prefix is never overwritten: a raw '\r' never follows a prefix.
    assert not re.search(r"\[\d\] \r", screen)
    # Completed lines keep their final state, prefix first.
    final = [ln for ln in screen.replace("\r", "").splitlines() if ln.endswith("90%|##")]
    assert any(ln.endswith("[0] 90%|##") for ln in final), screen
    assert any(ln.endswith("[1] 90%|##") for ln in final), screen
    # The rank file keeps the exact bytes.
    run = ml.run_dirs()[-1]
    assert (run / "rank-0.log").read_bytes() == b"\r30%|##\r30%|##\r60%|##\r90%|##\n"


def test_progress_off_a_terminal_prints_states_as_lines_never_a_raw_cr(ml):
    r = ml("run", "-n", "2", "--", "sh", "-c", PROGRESS)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stdout
    lines = r.stdout.splitlines()
    for rank in (0, 1):
        mine = [ln for ln in lines if ln.startswith(f"[{rank}] ")]
        # The first state at once, the final state when the line ends (throttled in between).
        assert mine[-1] == f"[{rank}] 90%|##", r.stdout
        assert mine[0] in (f"[{rank}] 30%|##", f"[{rank}] 60%|##"), r.stdout
        assert len(mine) <= 3, r.stdout  # not every state: throttled
    run = ml.run_dirs()[-1]
    assert (run / "rank-1.log").read_bytes() == b"\r30%|##\r60%|##\r90%|##\n"


def test_control_bytes_escaped_and_bad_utf8_passed_the_same_on_every_line(ml):
    script = 'printf "a\\001b\\377\\n"; printf "\\033[31mred\\033[0m \\033]0;title\\007 \\342\\234\\223\\n"; printf "a\\001b\\377"'
    r = ml("run", "-n", "2", "--", "sh", "-c", script, text=False)
    assert r.returncode == 0, r.stderr
    # Piped: control bytes escaped, invalid UTF-8 passed as it is (docs/spec.md, "Console output").
    lines = r.stdout.decode(errors="surrogateescape").splitlines()
    for rank in (0, 1):
        mine = [ln for ln in lines if ln.startswith(f"[{rank}] ")]
        assert mine[0] == f"[{rank}] a\\x01b\udcff"
        # Colour passes, other escapes do not; valid UTF-8 passes.
        assert mine[1] == f"[{rank}] \x1b[31mred\x1b[0m \\x1b]0;title\\x07 \u2713"
        # The unterminated last line is escaped like the others.
        assert mine[2] == mine[0]
    run = ml.run_dirs()[-1]
    assert (run / "rank-0.log").read_bytes().startswith(b"a\x01b\xff\n")


def test_stdin_goes_to_rank_0_only(ml):
    r = ml("run", "-n", "2", "--stdin", "--", "sh", "-c", "read x; echo got $x", input="hi\n")
    assert r.returncode == 0, r.stderr
    assert "[0] got hi" in r.stdout.splitlines()
    assert "[1] got " in r.stdout.splitlines() or "[1] got" in r.stdout.splitlines()


def test_stdin_rank_chooses_the_rank_and_eof_reaches_it(ml):
    r = ml("run", "-n", "3", "--stdin-rank", "2", "--", "sh", "-c", "cat; echo end", input="a\nb\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("[2]")] == ["[2] a", "[2] b", "[2] end"]
    assert [ln for ln in lines if ln.startswith("[0]")] == ["[0] end"]


def test_stdin_rank_out_of_range_and_detach_are_usage_errors(ml):
    r = ml("run", "-n", "2", "--stdin-rank", "5", "--", "true")
    assert r.returncode == 2
    assert "--stdin-rank 5: the job has 2 ranks (0..1)" in r.stderr
    r = ml("run", "-n", "2", "--stdin", "--detach", "--", "true")
    assert r.returncode == 2
    assert "--stdin cannot be used with --detach" in r.stderr
    assert ml.run_dirs() == []


def test_interactive_prompt_on_a_terminal(ml):
    """A pdb-like prompt: shown without its newline, answered through --stdin."""
    p, master = run_on_pty(ml, "run", "-n", "2", "--stdin", "--", "sh", "-c",
                           'if [ "$RANK" = 0 ]; then printf "(Pdb) "; read x; echo "you said $x"; fi',
                           stdin=subprocess.PIPE)
    try:
        got = plain(read_until(master, lambda b: b"(Pdb) " in b, 15.0))
        assert b"[0] (Pdb) " in got, got
        p.stdin.write(b"continue\n")
        p.stdin.flush()
        got += plain(read_until(master, lambda b: b"you said" in b, 15.0))
        p.stdin.close()
        p.stdin = None  # closed: communicate() must not flush it
        _, err = communicate(p, 30)
    finally:
        os.close(master)
    assert p.returncode == 0, err
    assert b"you said continue" in got


def test_stdin_closed_is_end_of_input_not_a_hang(ml):
    r = subprocess.run(["sh", "-c", 'exec <&-; exec "$0" run -n 1 --stdin -- sh -c "read x; echo got \\$x"',
                        ml.bin], env=ml.env, capture_output=True, text=True, timeout=30, cwd=ml.dir)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[0] got"]


def test_stdin_a_rank_does_not_read_does_not_stall_the_job(ml):
    r = ml("run", "-n", "2", "--stdin", "--", "sh", "-c", "sleep 0.5; echo ok", input="x" * (4 << 20))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[0] ok", "[1] ok"]
