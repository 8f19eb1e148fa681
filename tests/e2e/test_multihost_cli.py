"""Issue 9's host-facing CLI edges on the 4-host test cluster (tests/cluster/): what environment
reaches remote ranks (-x), validate's resolution check, the slot rule over -H, the "connecting"
line, and the changed-host-key hint naming the known_hosts file actually used.

Needs root and network namespaces; skipped otherwise (reason from cluster.available()).
"""
import re

from multihost_fixtures import cluster, fingerprint, mh, shared_root  # noqa: F401  (fixtures by name)


def test_launcher_env_reaches_remote_ranks_only_when_forwarded(mh):
    env = {"ISSUE9_FOO": "from-launcher", "ISSUE9_BAR": "not-forwarded"}
    p = mh.run("-H", "h1:1,h2:1", "--workdir", "/tmp", "-x", "ISSUE9_FOO", "-x", "ISSUE9_SET=given", "--",
               "sh", "-c", 'echo "got:${ISSUE9_FOO:-none}:${ISSUE9_BAR:-none}:${ISSUE9_SET:-none}:$(hostname)"',
               env=env)
    assert p.returncode == 0, p.stderr
    got = sorted(l.split("got:", 1)[1] for l in p.stdout.splitlines() if "got:" in l)
    assert got == ["from-launcher:none:given:h1", "from-launcher:none:given:h2"], p.stdout


def test_validate_names_the_host_that_does_not_resolve(mh):
    p = mh.ml("validate", *mh.args("-H", "h1,h9", "--", "true"))
    assert p.returncode != 0, p.stdout
    assert "h9" in p.stderr and "does not resolve" in p.stderr, p.stderr
    assert "h1" not in p.stderr.split("does not resolve")[0].replace("h1,h9", ""), p.stderr


def test_validate_resolves_through_the_ssh_config(mh, cluster):
    p = mh.ml("validate", *mh.args("-H", "h1:2,h2:2", "--", "true"))
    assert p.returncode == 0, p.stderr
    assert f"h1: resolves to {cluster.ip('h1')} (HostName {cluster.ip('h1')}" in p.stdout, p.stdout
    assert "not checked:" in p.stdout and "mltrain doctor" in p.stdout


def test_more_ranks_than_listed_hosts_needs_oversubscribe(mh):
    p = mh.run("-H", "h1,h2", "-n", "3", "--workdir", "/tmp", "--", "true")
    assert p.returncode == 2, p.stderr
    assert "only 2 slots" in p.stderr and "--oversubscribe" in p.stderr
    assert not mh.ml.run_dirs()
    p = mh.run("-H", "h1,h2", "-n", "3", "--oversubscribe", "--workdir", "/tmp", "--",
               "sh", "-c", 'echo "on:$RANK:$(hostname)"')
    assert p.returncode == 0, p.stderr
    on = sorted(l.split("on:", 1)[1] for l in p.stdout.splitlines() if "on:" in l)
    assert on == ["0:h1", "1:h1", "2:h2"], p.stdout


def test_connecting_line_for_remote_hosts_only(mh):
    p = mh.run("-H", "h1:1,h2:1", "--workdir", "/tmp", "--", "true")
    assert p.returncode == 0, p.stderr
    assert re.search(r"^mltrain: connecting to 2 hosts \(h1, h2\)\.\.\.$", p.stderr, re.M), p.stderr
    local = mh.ml("run", "-n", "2", "--", "true")
    assert local.returncode == 0 and "connecting" not in local.stderr, local.stderr


def test_changed_host_key_hint_names_the_known_hosts_file(mh, cluster):
    cluster.rekey("h3")
    try:
        p = mh.run("-H", "h3:1", "--workdir", "/tmp", "--", "true")
        assert p.returncode == 255, p.stderr
        assert "HOST KEY CHANGED" in p.stderr, p.stderr
        kh = str(cluster.known_hosts)
        assert f"recorded in {kh}" in p.stderr, p.stderr
        assert f"ssh-keygen -f {kh} -R {cluster.ip('h3')}" in p.stderr, p.stderr
    finally:
        cluster.trust("h3")


def test_failure_summary_shows_a_remote_ranks_error_file(mh):
    # torch's @record writes TORCHELASTIC_ERROR_FILE on the rank's own host; its agent sends it back.
    sh = ('[ "$RANK" = 1 ] || exit 0; '
          'printf \'{"message": {"message": "ValueError: lr must be positive", "extraInfo": {}}}\' '
          '> "$TORCHELASTIC_ERROR_FILE"; exit 3')
    p = mh.run("-H", "h1:1,h2:1", "--workdir", "/tmp", "--", "sh", "-c", sh)
    assert p.returncode == 3, p.stderr
    # The file is in the agent's private folder for the run (docs/security.md), named here by its name.
    assert re.search(r"rank 1's error file \(rank-1\.error\.json on h2\):\n"
                     r"    ValueError: lr must be positive", p.stderr), p.stderr
