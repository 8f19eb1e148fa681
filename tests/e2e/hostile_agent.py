"""A compromised host's agent, for the adversarial tests: it runs the real agent (its path is the
last argument, as MLTRAIN_LOCAL_AGENT_WRAPPER gives it) and relays every frame both ways, except
that a play (HOSTILE_PLAY) answers some requests itself with any frames it likes.

Frame: u32 payload length, u16 type, u16 flags, u32 id, payload (runner/protocol/protocol.h).

Plays (HOSTILE_ARG: a number the play reads):
  pull-names    a Pull gets HOSTILE_ARG PullFile frames of 2,000-byte names that are refused
                ("../" ones), then PullDone
  pull-paths    a Pull gets files whose names try to leave the folder, and a legitimate one
  pull-stall    a Pull gets a 100-byte file of which 10 bytes come, then nothing (pings still
                answered by the real agent)
  pull-flood    a Pull gets one file that claims 1 TiB and keeps sending data
  pull-strings  a Pull gets a PullDone whose problem list holds HOSTILE_ARG empty strings
  pull-nul      a Pull gets problems with a NUL and terminal escapes inside, then PullDone
  slow-sync     a slow link: every SyncData frame reaches the agent HOSTILE_ARG ms late
  pull-collide  a Pull gets names that collide with each other: a file then a folder through it,
                a folder then a file over it, and a name like the launcher's own temporary files
  pull-unopened a Pull gets PullData for a file it never opened, then a file with bytes past its size
  pull-oddnames a Pull gets a file whose name holds a newline, a control byte and invalid UTF-8, and
                one whose name is NAME_MAX (255) bytes long
"""
import os
import struct
import subprocess
import sys
import threading
import time

SYNC_MANIFEST, SYNC_DATA, SYNC_END, PULL = 13, 14, 15, 17
OUTPUT, SYNC_WANT, SYNC_DONE, PULL_FILE, PULL_DATA, PULL_DONE = 104, 113, 114, 116, 117, 118
SETUP_ID = 0xFFFFFFFE
HEADER = struct.Struct("<IHHI")


def read_exact(f, n):
    b = bytearray()
    while len(b) < n:
        chunk = f.read(n - len(b))
        if not chunk:
            return None
        b += chunk
    return bytes(b)


def frames(f):
    while True:
        h = read_exact(f, HEADER.size)
        if h is None:
            return
        n, t, flags, fid = HEADER.unpack(h)
        p = read_exact(f, n) if n else b""
        if p is None:
            return
        yield t, flags, fid, p


def frame(t, payload=b"", fid=0):
    return HEADER.pack(len(payload), t, 0, fid) + payload


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<I", len(b)) + b


def strings(items):
    return struct.pack("<I", len(items)) + b"".join(s(i) for i in items)


def pull_file(path, size, fid, mode=0o644):
    return frame(PULL_FILE, s(path) + struct.pack("<IQQ", mode, size, 0), fid)


def pull_done(files, nbytes, problems=()):
    return frame(PULL_DONE, struct.pack("<IQ", files, nbytes) + strings(list(problems)) + struct.pack("<I", 0))


class Out:
    """The launcher's side of the stream, written by two threads."""

    def __init__(self, f):
        self.f, self.lock = f, threading.Lock()

    def send(self, data):
        with self.lock:
            self.f.write(data)
            self.f.flush()


def play_pull(out, play, arg):
    if play == "pull-names":
        name = "../" + "x" * 1997
        batch = b"".join(pull_file(name, 0, i + 1) for i in range(1000))
        for _ in range(max(1, arg // 1000)):
            out.send(batch)
        out.send(pull_done(arg, 0))
    elif play == "pull-paths":
        fid = 0
        for bad in ["../escaped.txt", "/tmp/absolute.txt", "a/../../up.txt", "./dot.txt", "a//b.txt",
                    "ok/../../x.txt", "file-then-folder", "file-then-folder/inside.txt", "good/ok.txt"]:
            fid += 1
            out.send(pull_file(bad, 3, fid) + frame(PULL_DATA, b"hi\n", fid))
        out.send(pull_done(fid, 3 * fid))
    elif play == "pull-stall":
        out.send(pull_file("slow.bin", 100, 1) + frame(PULL_DATA, b"0123456789", 1))
        # and nothing more: the real agent keeps answering pings
    elif play == "pull-flood":
        out.send(pull_file("huge.bin", 1 << 40, 1))
        chunk = frame(PULL_DATA, b"\0" * (1 << 20), 1)
        try:
            while True:
                out.send(chunk)
        except (BrokenPipeError, OSError):
            pass
    elif play == "pull-strings":
        out.send(pull_done(0, 0, [b""] * arg))
    elif play == "pull-nul":
        out.send(pull_done(0, 0, [b"before\0after", b"\x1b]0;owned\x07\x1b[2Jtitle", b"ok"]))
    elif play == "pull-collide":
        for fid, (name, body) in enumerate([("x", b"x\n"), ("x/y", b"y\n"), ("z/q", b"q\n"), ("z", b"z\n"),
                                            (".mltrain-tmp-9", b"t\n")], 1):
            out.send(pull_file(name, len(body), fid) + frame(PULL_DATA, body, fid))
        out.send(pull_done(5, 10))
    elif play == "pull-unopened":
        out.send(frame(PULL_DATA, b"A" * 1000, 77))
        out.send(pull_file("ok.txt", 3, 1) + frame(PULL_DATA, b"ok\n", 1) + frame(PULL_DATA, b"MORE", 1))
        out.send(pull_done(1, 3))
    elif play == "pull-oddnames":
        out.send(pull_file(b"odd\nname\x01\xff", 1, 1) + frame(PULL_DATA, b"1", 1))
        out.send(pull_file("m" * 255, 1, 2) + frame(PULL_DATA, b"2", 2))
        out.send(pull_done(2, 2))
    elif play == "pull-empties":  # HOSTILE_ARG empty files, each in a folder of its own
        for k in range(0, arg, 2000):
            out.send(b"".join(pull_file(f"d{i:07d}/e{i}", 0, i + 1) for i in range(k, min(arg, k + 2000))))
        out.send(pull_done(arg, 0))
    elif play == "pull-keepalive":  # 10 of 100 bytes, then an empty PullData and a refused name each second
        out.send(pull_file("slow.bin", 100, 1) + frame(PULL_DATA, b"0123456789", 1))
        while True:
            time.sleep(1)
            out.send(frame(PULL_DATA, b"", 1) + pull_file("../x", 0, 2))
    elif play == "pull-deep":  # one empty file HOSTILE_ARG folders deep
        out.send(pull_file("a/" * arg + "f", 0, 1) + pull_done(1, 0))
    elif play == "output":  # a rank's output and setup output, unasked (a cp, doctor or top has no console)
        out.send(frame(OUTPUT, b"hello from a rank\n", 0) + frame(OUTPUT, b"setup says\n", SETUP_ID))
        out.send(pull_done(0, 0))
    elif play == "setup-flood":  # HOSTILE_ARG MiB of setup output with no newline
        chunk = frame(OUTPUT, b"x" * (1 << 20), SETUP_ID)
        for _ in range(arg):
            out.send(chunk)
        out.send(pull_done(0, 0))


def last_manifest(p):
    """Whether a SyncManifest payload is the last frame: its `last` field, then the run id (a
    string: u32 length, bytes), end it."""
    for n in range(0, 257):
        if len(p) >= n + 8 and struct.unpack("<I", p[len(p) - n - 4:len(p) - n])[0] == n:
            return p[len(p) - n - 8:len(p) - n - 4] == struct.pack("<I", 1)
    return False


def main():
    play, arg = os.environ.get("HOSTILE_PLAY", ""), int(os.environ.get("HOSTILE_ARG", "0") or 0)
    agent = subprocess.Popen([sys.argv[-1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    out = Out(sys.stdout.buffer)

    def from_agent():
        for t, flags, fid, p in frames(agent.stdout):
            out.send(HEADER.pack(len(p), t, flags, fid) + p)
            if play == "output-after-hello" and t == 101:  # rank output right after the greeting
                out.send(frame(OUTPUT, b"boo\n", 0))
        os._exit(0)

    threading.Thread(target=from_agent, daemon=True).start()
    for t, flags, fid, p in frames(sys.stdin.buffer):
        if t in (SYNC_MANIFEST, SYNC_DATA, SYNC_END) and play.startswith("sync-"):
            if t == SYNC_MANIFEST and last_manifest(p):
                want = [0] * (arg if play == "sync-want" else 0)
                problems = [b""] * (arg if play == "sync-problems" else 0)
                out.send(frame(SYNC_WANT, s("/tmp/x") + struct.pack("<I", len(want)) +
                               b"".join(struct.pack("<i", w) for w in want) + struct.pack("<I", 0) +
                               strings(problems)))
            elif t == SYNC_END:
                out.send(frame(SYNC_DONE, struct.pack("<IQ", 0, 0) + strings([])))
            continue
        if t == PULL and (play.startswith("pull-") or play in ("output", "setup-flood")):
            threading.Thread(target=play_pull, args=(out, play, arg), daemon=True).start()
            continue
        if t == SYNC_DATA and play == "slow-sync":
            time.sleep(arg / 1000)
        agent.stdin.write(HEADER.pack(len(p), t, flags, fid) + p)
        agent.stdin.flush()
    agent.stdin.close()
    agent.wait()


if __name__ == "__main__":
    main()
