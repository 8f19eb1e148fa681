"""`mltrain ssh RUN --rank N` on the test cluster (tests/cluster/), driven through tmux: a login
shell on that rank's host, in the run's working directory, with the rank's environment; `-- CMD`
runs one command there and returns its exit code."""
import re
import time

from multihost_fixtures import cluster, mh, shared_root  # noqa: F401 (fixtures)
from test_top import Tmux, tmux  # noqa: F401 (fixture)


def test_ssh_opens_a_shell_where_the_rank_runs(mh, tmux):  # noqa: F811
    work = mh.shared / "work"
    work.mkdir()
    work.chmod(0o777)
    r = mh.ml("run", *mh.args("-d", "-H", "h1:1,h2:1,h3:1", "--workdir", work, "--", "sleep", "120"), timeout=90)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()

    # One command: its output and exit code come back.
    c = mh.ml("ssh", run_id, "-r", "1", *mh.args(), "--", 'echo "AT $(hostname) $(pwd) RANK=$RANK"; exit 6',
              timeout=60)
    assert c.returncode == 6, c.stderr
    assert c.stdout.strip() == f"AT h2 {work} RANK=1", c.stdout

    # A terminal: a login shell on h3 in the run's folder, with the rank's environment.
    tmux.start(f"{mh.ml.bin} ssh {run_id} --rank 2 --ssh-config {mh.c.ssh_config}; echo SSH-EXIT=$?; sleep 60")
    tmux.wait_for(lambda s: s.strip() != "", within_s=30)
    time.sleep(1)  # the login shell's prompt
    tmux("send-keys", "-t", "t", 'echo "AT $(hostname) $(pwd) RANK=$RANK LOCAL=$LOCAL_RANK tty=$(tty)"', "Enter")
    s = tmux.wait_for(lambda s: re.search(r"^AT \S+ ", s, re.M) is not None)
    line = re.search(r"^AT .*$", s, re.M)[0]
    assert line.startswith(f"AT h3 {work} RANK=2 LOCAL=0 tty=/dev/pts/"), s
    tmux("send-keys", "-t", "t", "exit 4", "Enter")
    s = tmux.wait_for(lambda s: "SSH-EXIT=" in s)
    assert "SSH-EXIT=4" in s, s
    mh.ml("stop", run_id, timeout=60)


def test_ssh_names_what_does_not_exist(mh):
    r = mh.ml("ssh", "no-such-run", *mh.args())
    assert r.returncode == 2 and "no run" in r.stderr, r.stderr
