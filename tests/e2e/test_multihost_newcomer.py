"""What a new user hit, round 2 (issue 33), on the test cluster with homes of their own: exec's
one-word shell form on hosts, ssh and cp after an ad-hoc run reach its hosts with the ssh config it
used, ssh's shell has the rank's PYTHONPATH, code missing on a host points to [sync], an unreadable
workdir fails preflight, a host that is down is named with --exclude."""
import re
import tempfile
from pathlib import Path

from multihost_fixtures import mh, module_cluster, shared_root  # noqa: F401 (fixtures)

cluster = module_cluster(n=2, private_homes=True)


def test_exec_one_word_is_a_shell_command_line_on_every_host(mh):
    r = mh.ml("exec", *mh.args("-H", "h1,h2"), "--", "cd ~ && pwd && hostname", timeout=90)
    assert r.returncode == 0, r.stderr
    assert "name 'cd" not in r.stderr and "rename the job" not in r.stderr, r.stderr
    for h in ("h1", "h2"):
        assert f"[{h}] {h}" in r.stdout, r.stdout
    assert "succeeded on 2 hosts" in r.stderr, r.stderr


def test_ssh_and_cp_after_an_ad_hoc_run_use_its_ssh_config(mh):
    out = "newcomer-cp.txt"
    r = mh.run("-H", "h1,h2", "--workdir", "/tmp", "--", "sh", "-c",
               f'echo "from $(hostname)" > {mh.shared}/{out}.$RANK; cp {mh.shared}/{out}.$RANK ~/{out}',
               timeout=90)
    assert r.returncode == 0, r.stderr
    # No --ssh-config now: the run's record says which it used.
    r = mh.ml("ssh", "latest", "-r", "1", "--", "hostname", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "h2", r.stdout
    dest = Path(tempfile.mkdtemp(dir=mh.shared)) / "got.txt"
    r = mh.ml("cp", f"latest:1:~/{out}", dest, timeout=60)
    assert r.returncode == 0, r.stderr
    assert dest.read_text() == "from h2\n"
    assert not re.search(r"\b(h\d): \1:", r.stderr), r.stderr


def test_ssh_shell_has_the_ranks_pythonpath(mh):
    r = mh.run("-H", "h1", "--workdir", "/tmp", "--", "python3", "-c",
               "import mltrain, os; print('rank imports', os.path.dirname(mltrain.__file__))", timeout=90)
    assert r.returncode == 0, r.stderr
    in_rank = re.search(r"rank imports (\S+)", r.stdout)[1]
    # --ssh-config given: this test is about the environment, not about finding the host.
    r = mh.ml("ssh", "latest", *mh.args(), "--",
              "python3 -c 'import mltrain, os; print(os.path.dirname(mltrain.__file__))'", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == in_rank, (r.stdout, r.stderr)
    r = mh.ml("ssh", "latest", *mh.args(), "--", 'echo "rt=$MLTRAIN_RUNTIME"', timeout=60)
    assert r.returncode == 0 and "rt=/" in r.stdout, (r.stdout, r.stderr)


def test_code_missing_on_a_host_points_to_sync(mh):
    spec = mh.shared / "missing.toml"
    spec.write_text('[run]\ncommand = "true"\n')
    missing = "/tmp/mlt-newcomer-not-on-any-host"
    r = mh.run(spec, "-H", "h1", "--workdir", missing, timeout=90)
    assert r.returncode == 127, r.stderr
    assert "does not exist here" in r.stderr and "[sync]" in r.stderr, r.stderr


def test_a_workdir_the_login_cannot_read_fails_preflight(mh):
    locked = Path(tempfile.mkdtemp(prefix="mlt-locked-", dir="/tmp"))
    locked.chmod(0o700)  # root's; the hosts' user may not enter it
    try:
        r = mh.run("-H", "h1", "--workdir", locked, "--", "true", timeout=90)
        assert r.returncode == 127, r.stderr
        assert "preflight failed" in r.stderr and "not readable" in r.stderr, r.stderr
        assert "no rank was started" in r.stderr
    finally:
        locked.rmdir()


def test_a_host_that_is_down_is_named_with_exclude(mh, cluster):  # noqa: F811
    spec = mh.shared / "down.toml"
    spec.write_text('[run]\ncommand = "true"\n[ssh]\nconnect_timeout = "2s"\n')
    cluster.cut("h2")
    try:
        r = mh.run(spec, "-H", "h1,h2", "--workdir", "/tmp", timeout=90)
    finally:
        cluster.heal("h2")
    assert r.returncode == 255, r.stderr
    assert "--exclude h2" in r.stderr and re.search(r"no answer in \d+s", r.stderr), r.stderr
