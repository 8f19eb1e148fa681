"""`mltrain exec` on the 4-host test cluster (tests/cluster/): one command per host, each line
prefixed by its host, run in the login directory; every host runs to its end and the exit code
is the first failure's, its host named. The same on one host: test_cli_edges.py."""
import re

from multihost_fixtures import cluster, mh, shared_root  # noqa: F401 (fixtures)

HOSTS = "h1,h2,h3,h4"


def test_exec_runs_once_on_every_host_prefixed_by_host(mh):
    r = mh.ml("exec", *mh.args("-H", HOSTS), "--", "sh", "-c", 'echo "on $(hostname) rank=$RANK in $(pwd)"',
              timeout=90)
    assert r.returncode == 0, r.stderr
    lines = sorted(l for l in r.stdout.splitlines() if " on " in l)
    assert [re.sub(r" rank=\d+", "", l) for l in lines] == [
        f"[h{k}] on h{k} in /home/mltest" for k in range(1, 5)], r.stdout
    assert len(lines) == 4


def test_exec_lets_every_host_finish_and_exits_with_the_first_failure(mh):
    # h4 fails 2 s after h3 did (not after h3 started: the hosts start at their own pace).
    failed = mh.shared / "h3-failed"
    script = (f'case "$(hostname)" in h3) touch {failed}; exit 4;; '
              f'h4) until [ -e {failed} ]; do sleep 0.05; done; sleep 2; exit 5;; esac; '
              'sleep 4; echo "finished on $(hostname)"')
    r = mh.ml("exec", *mh.args("-H", HOSTS), "--", "sh", "-c", script, timeout=90)
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert sorted(re.findall(r"finished on (h\d)", r.stdout)) == ["h1", "h2"], r.stdout
    assert re.search(r"h3 \(\S+\): the command failed with exit code 4 after [\d.]+s \(first failure\)", r.stderr), r.stderr
    assert re.search(r"h4 \(\S+\): the command failed with exit code 5", r.stderr), r.stderr
    assert "stopping" not in r.stderr, r.stderr


def test_exec_needs_a_command_and_names_an_unreachable_host(mh):
    r = mh.ml("exec", *mh.args("-H", HOSTS))
    assert r.returncode == 2 and "needs a command after '--'" in r.stderr, r.stderr
    r = mh.ml("exec", *mh.args("-H", "h1,nosuchhost.invalid"), "--", "true", timeout=90)
    assert r.returncode == 255, r.stderr
    assert "nosuchhost.invalid" in r.stderr, r.stderr
