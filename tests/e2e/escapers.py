"""A rank that leaves processes behind the way real programs do, for the escape tests.

    escapers.py MARKER END DIR

Rank RANK plays one pattern (RANK mod 4); every process it leaves carries MARKER in its argv
(Python forks keep the rank's argv; the rest are `sleep MARKER`), and every one ignores SIGTERM,
SIGHUP and SIGINT:
  0 daemon     a setsid child starts a setsid grandchild and exits (the classic double fork)
  1 reforker   a child forks and exits every 20 ms, so its pid keeps changing
  2 tree       200 setsid descendants in a tree (10 children with 19 children each)
  3 subreaper  the rank makes itself a child subreaper; its setsid grandchild is handed to it
Then it touches DIR/ready-RANK and ends as END says: "normal" exits 0 half a second later, "fail"
has rank 3 exit 1 once all four are ready (the others hold), "hold" sleeps until killed.
"""
import ctypes
import os
import signal
import sys
import time

MARKER, END, DIR = sys.argv[1], sys.argv[2], sys.argv[3]
RANK = int(os.environ["RANK"])


def ignore_term():
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)


def sleeper():
    """Becomes `sleep MARKER` (a TERM ignored before exec stays ignored)."""
    os.execvp("sleep", ["sleep", MARKER])


def daemon():
    """The classic double fork: a setsid child starts a setsid grandchild and exits."""
    if os.fork() == 0:
        os.setsid()
        ignore_term()
        if os.fork() == 0:
            os.setsid()
            sleeper()
        os._exit(0)
    os.wait()


def reforker():
    if os.fork() == 0:
        os.setsid()
        ignore_term()
        while True:
            time.sleep(0.02)  # alive long enough between forks for a /proc scan to see it
            if os.fork() != 0:
                os._exit(0)


def tree():
    for _ in range(10):
        if os.fork() == 0:
            os.setsid()
            ignore_term()
            for _ in range(19):
                if os.fork() == 0:
                    os.setsid()
                    sleeper()
            sleeper()


def subreaper():
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    daemon()  # the grandchild, orphaned, is handed to this rank


[daemon, reforker, tree, subreaper][RANK % 4]()
time.sleep(0.2)  # let the last of them get going
open(os.path.join(DIR, f"ready-{RANK}"), "w").close()
print(f"rank {RANK} ready", flush=True)
if END == "normal":
    time.sleep(0.5)
    sys.exit(0)
if END == "fail" and RANK == 3:
    while len([f for f in os.listdir(DIR) if f.startswith("ready-")]) < 4:
        time.sleep(0.05)
    sys.exit(1)
while True:
    time.sleep(3600)
