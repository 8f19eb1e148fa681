"""Multi-host must-holds on the 4-host test cluster (tests/cluster/): placement and rank env,
stock DDP, gang teardown across hosts, a SIGKILLed launcher, a cut-off host, host keys,
adversarial env values over ssh, sshd MaxSessions, preflight, doctor and bench.

Needs root and network namespaces; skipped otherwise (reason from cluster.available()).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import REPO, communicate, pids_with_arg, wait_for, wait_gone
from multihost_fixtures import (  # noqa: F401  (fixtures are used by name)
    agent_ancestors, alive, cached_agent_path, cluster, fingerprint, host_of_pid, LineReader, mh, netns_inode,
    python_has_torch, shared_root, uid_of, wait_pids_gone)

HOSTS = ("h1", "h2", "h3", "h4")


def _ip(h):
    return f"10.231.0.{10 + int(h[1:])}"


# --- 1. placement and the rank environment ----------------------------------------------------

PROBE = ('echo "MH $RANK $LOCAL_RANK $NODE_RANK $LOCAL_WORLD_SIZE $WORLD_SIZE $MASTER_ADDR '
         '${NCCL_SOCKET_IFNAME:-unset} ${GLOO_SOCKET_IFNAME:-unset} $(hostname) '
         '$(readlink /proc/self/ns/net) $GROUP_RANK $MASTER_PORT"')


@pytest.mark.parametrize("layout", [
    [("h1", 2), ("h2", 3), ("h3", 1), ("h4", 2)],
    [("h3", 1), ("h1", 3), ("h4", 2), ("h2", 1)],   # hostfile order, not name order
], ids=["h1-first", "h3-first"])
def test_placement_and_rank_env(mh, layout):
    hf = mh.ml.write("hosts.txt", "".join(f"{h} slots={n}\n" for h, n in layout))
    p = mh.run("--hostfile", hf, "--workdir", "/tmp", "--", "sh", "-c", PROBE)
    assert p.returncode == 0, p.stderr
    world = sum(n for _, n in layout)
    expect = []
    for node, (h, n) in enumerate(layout):
        for lr in range(n):
            expect.append((h, node, lr, n))
    assert len(expect) == world
    master = _ip(layout[0][0])
    ports = set()
    for rank, (h, node, lr, n) in enumerate(expect):
        lines = [l for l in mh.rank_log(rank).splitlines() if l.startswith("MH ")]
        assert len(lines) == 1, (rank, mh.rank_log(rank))
        f = lines[0].split()
        assert f[1:6] == [str(rank), str(lr), str(node), str(n), str(world)], (rank, h, lines[0])
        assert f[6] == master, f"rank {rank}: MASTER_ADDR {f[6]}, want {master} (rank 0's host)"
        assert not f[6].startswith("127.") and f[6] not in ("localhost", "::1")
        assert f[7] == "eth0" and f[8] == "eth0", f"rank {rank} on {h}: IFNAME {f[7]}/{f[8]}"
        assert f[9] == h, f"rank {rank} should run on {h}, hostname says {f[9]}"
        assert f[10] == f"net:[{netns_inode(h)}]", f"rank {rank} not in {h}'s network namespace"
        assert f[11] == str(node)  # GROUP_RANK
        ports.add(f[12])
    assert len(ports) == 1 and ports.pop().isdigit()
    rec = mh.show()
    assert [x["name"] for x in rec["hosts"]] == [h for h, _ in layout]
    assert rec["master_addr"] == master
    assert [(r["rank"], r["host"], r["local_rank"]) for r in rec["ranks"]] \
        == [(i, h, lr) for i, (h, _, lr, _) in enumerate(expect)]
    # `logs` prefixes as the live console did: [host:rank] on a multi-host run.
    logs = mh.ml("logs").stdout.splitlines()
    for rank, (h, *_rest) in enumerate(expect):
        assert sum(l.startswith(f"[{h}:{rank}] MH {rank} ") for l in logs) == 1, (rank, h, logs)


def test_user_set_socket_ifname_is_kept(mh):
    p = mh.run("-H", "h1:1,h2:1", "--workdir", "/tmp", "--env", "NCCL_SOCKET_IFNAME=lo",
               "--", "sh", "-c", PROBE)
    assert p.returncode == 0, p.stderr
    for rank in (0, 1):
        f = [l for l in mh.rank_log(rank).splitlines() if l.startswith("MH ")][0].split()
        assert f[7] == "lo", "the user's NCCL_SOCKET_IFNAME must win"
        assert f[8] == "eth0", "GLOO_SOCKET_IFNAME still set by mltrain"


# --- 2. stock PyTorch DDP across 3 hosts x 2 ranks ---------------------------------------------

def test_ddp_three_hosts_identical_weights(mh, cluster):
    ok, why = python_has_torch()
    if not ok:
        pytest.skip(why)
    r = cluster.run("h2", f"test -r {REPO}/examples/ddp/train.py && cd {REPO} && echo ok")
    if "ok" not in r.stdout:
        pytest.skip(f"repo {REPO} not readable by the cluster user: {r.stderr.strip()}")
    p = mh.run("-H", "h1:2,h2:2,h3:2", "--workdir", REPO, "--",
               "/usr/bin/python3", "examples/ddp/train.py", "--steps", "20", timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    digests = {}
    for rank in range(6):
        m = re.findall(r"final weights sha256 ([0-9a-f]+)", mh.rank_log(rank))
        assert len(m) == 1, (rank, mh.rank_log(rank)[-2000:])
        digests[rank] = m[0]
    assert len(set(digests.values())) == 1, digests


# --- 3. a rank crashing on one host stops every rank on every host -----------------------------

def test_rank_crash_on_one_host_stops_all_hosts(mh):
    m = mh.ml.marker()
    crashed = mh.shared / "crashed"
    cmd = (f'if [ "$RANK" = 5 ]; then sleep 1; touch {crashed}; exit 7; fi; '
           f'exec sleep {m}')
    p = mh.popen("-H", "h1:2,h2:2,h3:2,h4:2", "--workdir", "/tmp", "--", "sh", "-c", cmd)
    wait_for(lambda: len(pids_with_arg(m)) == 7, 20, "7 sleeping ranks")
    ranks = pids_with_arg(m)
    assert {host_of_pid(x) for x in ranks} == set(HOSTS)
    wait_for(crashed.exists, 20, "rank 5 to crash")
    left = wait_gone(m, 3.0)
    assert not left, f"ranks still alive 3 s after rank 5 crashed: {left}"
    out, err = communicate(p, 30)
    assert p.returncode == 7, err
    first = [l for l in err.splitlines() if "first failure" in l]
    assert first and "h3" in first[0] and "rank 5" in first[0], err
    rec = mh.show()
    assert rec["failure"]["rank"] == 5, rec["failure"]
    assert "h3" in json.dumps(rec["failure"]), rec["failure"]
    assert rec["exit_code"] == 7


# --- 4. a SIGKILLed launcher leaves nothing on any host -----------------------------------------

def test_sigkill_launcher_leaves_nothing_anywhere(mh, cluster):
    m = mh.ml.marker()
    p = mh.popen("-H", "h1:2,h2:2,h3:2,h4:2", "--workdir", "/tmp", "--", "sleep", m)
    wait_for(lambda: len([x for x in pids_with_arg(m) if x != p.pid]) == 8, 20, "8 ranks")
    ranks = [x for x in pids_with_arg(m) if x != p.pid]
    agents = agent_ancestors(ranks)
    assert {host_of_pid(a) for a in agents} == set(HOSTS), \
        f"expected one mltrain-agent per host above the ranks, got {agents}"
    mltest_uid = uid_of(ranks[0])
    assert mltest_uid != 0 and all(uid_of(a) == mltest_uid for a in agents)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    left = wait_pids_gone(ranks + agents, 10.0)
    assert not left, f"10 s after SIGKILL to mltrain still alive: " \
        f"{[(x, host_of_pid(x)) for x in left]}"
    assert not pids_with_arg(m)


# --- 5. a host cut off mid-run --------------------------------------------------------------------

def test_cut_host_is_named_and_its_agent_stops_its_ranks(mh, cluster):
    m = mh.ml.marker()
    p = mh.popen("-H", "h1:2,h2:2,h3:2,h4:2", "--workdir", "/tmp", "--grace-period", "2s",
                 "--", "sleep", m)
    err = LineReader(p.stderr)
    try:
        wait_for(lambda: len([x for x in pids_with_arg(m) if x != p.pid]) == 8, 20, "8 ranks")
        ranks = [x for x in pids_with_arg(m) if x != p.pid]
        on_h2 = [x for x in ranks if host_of_pid(x) == "h2"]
        others = [x for x in ranks if x not in on_h2]
        assert len(on_h2) == 2
        h2_agents = agent_ancestors(on_h2)
        assert len(h2_agents) == 1
        cluster.cut("h2")
        t_cut = time.monotonic()
        try:
            p.wait(25)
        except subprocess.TimeoutExpired:
            pass
        rc = p.poll()
        named = err.first(lambda l: "h2" in l)
        assert named, f"launcher never named h2: {err.text()!r}"
        assert named[0] - t_cut <= 15.0, f"h2 named {named[0] - t_cut:.1f}s after the cut"
        assert rc == 255, f"exit {rc}; stderr {err.text()!r}"
        assert not [x for x in others if alive(x)], "other hosts' ranks left running"
        # The cut-off host's agent cannot hear the launcher: it must stop its ranks by itself.
        left = wait_pids_gone(on_h2, max(0.0, 15.0 + 2.0 + 3.0 - (time.monotonic() - t_cut)))
        assert not left, f"h2's ranks still alive {time.monotonic() - t_cut:.1f}s after the cut"
        left = wait_pids_gone(h2_agents, 5.0)
        assert not left, "h2's agent still alive after its ranks were stopped"
        rec = mh.show()
        assert rec["status"] == "host-failure" and rec["exit_code"] == 255, rec["status"]
        assert "h2" in json.dumps(rec["failure"]), rec["failure"]
    finally:
        cluster.heal("h2")
        err.join()


# --- 5b. a signal while a host is still connecting --------------------------------------------------

def agent_running_on(host):
    """Whether an mltrain agent runs on `host` (one test at a time uses the cluster)."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                comm = open(f"/proc/{d}/comm").read()
            except OSError:
                continue
            if comm.startswith("mltrain-agent") and host_of_pid(int(d), (host,)) == host:
                return True
    return False


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["INT", "TERM"])
def test_signal_while_a_host_connects_starts_nothing_anywhere(mh, cluster, sig, code):
    """Ctrl-C or SIGTERM while h2 (cut off) is still connecting: exit at once, nothing starts on h1."""
    cluster.cut("h2")
    try:
        p = mh.popen("-H", "h1:2,h2:2", "--workdir", "/tmp", "--", "sh", "-c",
                     f'touch {mh.shared}/r$RANK')
        wait_for(lambda: agent_running_on("h1"), 30, "h1's agent")
        time.sleep(1.0)  # h1 connected and answered; h2's connection hangs on the cut link
        t0 = time.monotonic()
        p.send_signal(sig)
        _, err = communicate(p, 10)
        took = time.monotonic() - t0
        assert p.returncode == code, err
        assert took < 5, f"exit {took:.2f}s after the signal"  # at once: not the 30 s h2 has to answer
        assert "no rank was started" in err, err
        time.sleep(0.5)
        assert mh.touched() == [], f"ranks ran: {mh.touched()}"
    finally:
        cluster.heal("h2")


def test_ctrl_c_while_a_detached_run_waits_for_preflight(mh, cluster):
    """`run -d` waits for preflight; Ctrl-C there reaches the background launcher: nothing starts."""
    cluster.cut("h2")
    try:
        p = mh.popen("-d", "-H", "h1:2,h2:2", "--workdir", "/tmp", "--", "sh", "-c",
                     f'touch {mh.shared}/r$RANK')
        wait_for(lambda: agent_running_on("h1"), 30, "h1's agent")
        time.sleep(1.0)  # h2's connection hangs on the cut link
        p.send_signal(signal.SIGINT)
        _, err = communicate(p, 10)
        assert p.returncode == 130, err
        assert "stopped by SIGINT before it started" in err, err
        rec = mh.show()
        assert rec["status"] == "interrupted" and rec["exit_code"] == 130, rec
    finally:
        cluster.heal("h2")
    time.sleep(0.5)
    assert mh.touched() == [], f"ranks ran: {mh.touched()}"


# --- 6. host keys: unknown and changed -----------------------------------------------------------

def _touch_cmd(mh):
    return ["--workdir", "/tmp", "--", "sh", "-c", f'touch {mh.shared}/r$RANK; sleep 0.2']


def _assert_nothing_started(mh):
    assert mh.touched() == [], f"ranks ran although preflight failed: {mh.touched()}"


def test_unknown_host_key_refused_then_accepted(mh, cluster):
    key = cluster.dir / "h3" / "ssh_host_ed25519_key.pub"
    fp = fingerprint(key)
    blob = key.read_text().split()[1]
    cluster.forget("h3")
    try:
        p = mh.run("--hostfile", cluster.hostfile, "--procs-per-host", "1", *_touch_cmd(mh))
        assert p.returncode == 255, p.stderr
        assert "h3" in p.stderr and fp in p.stderr, p.stderr
        assert "no rank was started" in p.stderr
        _assert_nothing_started(mh)
        assert blob not in cluster.known_hosts.read_text()

        p = mh.run("--hostfile", cluster.hostfile, "--procs-per-host", "1",
                   "--accept-new-host-keys", *_touch_cmd(mh))
        assert p.returncode == 0, p.stderr
        assert mh.touched() == ["r0", "r1", "r2", "r3"]
        recorded = [l for l in cluster.known_hosts.read_text().splitlines() if blob in l]
        assert recorded, "accepted key was not recorded in the ssh config's known_hosts"
        names = recorded[0].split()[0].split(",")
        assert "h3" in names or _ip("h3") in names or recorded[0].startswith("|1|"), recorded
        # Recorded for real: OpenSSH now accepts it, and so does a plain run.
        assert cluster.run("h3", "true").returncode == 0
        assert mh.run("-H", "h3:1", "--workdir", "/tmp", "--", "true").returncode == 0
    finally:
        cluster.trust("h3")


def test_unknown_host_key_message_mentions_accept_flag(mh, cluster):
    # Was a bug (per-host hints dropped from the preflight summary), fixed in 1805bea.
    cluster.forget("h3")
    try:
        p = mh.run("-H", "h1:1,h3:1", *_touch_cmd(mh))
        assert p.returncode == 255
        assert "--accept-new-host-keys" in p.stderr, p.stderr
    finally:
        cluster.trust("h3")


def test_changed_host_key_refused_loudly(mh, cluster):
    cluster.rekey("h2")
    try:
        fp = fingerprint(cluster.dir / "h2" / "ssh_host_ed25519_key.pub")
        for extra in ([], ["--accept-new-host-keys"]):  # accept-new never accepts a changed key
            p = mh.run("--hostfile", cluster.hostfile, "--procs-per-host", "1", *extra,
                       *_touch_cmd(mh))
            assert p.returncode == 255, p.stderr
            assert "HOST KEY CHANGED" in p.stderr and "h2" in p.stderr, p.stderr
            assert fp in p.stderr, p.stderr
            _assert_nothing_started(mh)
    finally:
        cluster.trust("h2")


# --- 7. adversarial env values arrive byte-exact ------------------------------------------------

NASTY = ["a b  c", "it's", 'say "hi"', "$HOME", "${IFS}x", "`id`", "$(id)", "l1\nl2\n", "t\tt",
         "ünï€😀", "back\\", ";|&", "", " lead and trail ", "x=y=z", "*", "~", "\\n", "!!",
         "a'b\"c$d`e\\f", "--flag", "-e", "#c", "%s%n", "cr\rx", "ctl\x01\x1b[31m\x7f",
         "'" * 40 + '"' * 40, "\\'\\\"", "A" * 100_000]

ENV_PROBE = ("import os; e = os.environb; print('ENV', os.environ['RANK'], ' '.join("
             "('MISSING' if k not in e else (e[k].hex() or '-')) "
             "for k in (b'V%d' % i for i in range(N))))")


def _toml_str(s):
    out = '"'
    for ch in s:
        if ch == "\\":
            out += "\\\\"
        elif ch == '"':
            out += '\\"'
        elif ch == "\n":
            out += "\\n"
        elif ch == "\t":
            out += "\\t"
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out += "\\u%04x" % ord(ch)
        else:
            out += ch
    return out + '"'


@pytest.mark.parametrize("how", ["--env", "spec-run.env", "forward_env"])
def test_adversarial_env_values_byte_exact(mh, how):
    code = ENV_PROBE.replace("range(N)", f"range({len(NASTY)})")
    argv = ["/usr/bin/python3", "-c", code]
    env = None
    if how == "--env":
        flags = [a for i, v in enumerate(NASTY) for a in ("--env", f"V{i}={v}")]
        p = mh.run("-H", "h2:1,h4:2", "--workdir", "/tmp", *flags, "--", *argv)
    else:
        spec = "[run]\nargv = [" + ", ".join(_toml_str(a) for a in argv) + "]\n"
        spec += 'workdir = "/tmp"\n'
        if how == "forward_env":
            spec += 'forward_env = ["V*"]\n'
            env = {f"V{i}": v for i, v in enumerate(NASTY)}
        else:
            spec += "[run.env]\n" + "".join(f"V{i} = {_toml_str(v)}\n" for i, v in enumerate(NASTY))
        spec += '[cluster]\nhosts = ["h2:1", "h4:2"]\n'
        f = mh.ml.write("job.toml", spec)
        p = mh.run(f, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    want = [v.encode().hex() or "-" for v in NASTY]
    for rank in range(3):
        lines = [l for l in mh.rank_log(rank).splitlines() if l.startswith("ENV ")]
        assert len(lines) == 1, mh.rank_log(rank)[-2000:]
        got = lines[0].split()[2:]
        bad = [(NASTY[i][:60], (bytes.fromhex(g) if g not in ("-", "MISSING") else g)[:60])
               for i, g in enumerate(got) if g != want[i]]
        assert len(got) == len(want) and not bad, f"rank {rank} ({how}): {bad}"


@pytest.mark.parametrize("how", ["--env", "forward_env"])
def test_non_utf8_env_value_byte_exact(mh, how):
    # Was a bug (exit 70, json type_error.316 on non-UTF-8 bytes), fixed in 1805bea.
    val = b"\xff\xfe latin1 \xe9"
    code = "import os; print('ENV', os.environb.get(b'KB', b'MISSING').hex())"
    args = [mh.ml.bin, "run", *mh.args("-H", "h2:1", "--workdir", "/tmp")]
    env = {k.encode(): v.encode() for k, v in mh.ml.env.items()}
    if how == "--env":
        args += [b"--env", b"KB=" + val]
    else:
        f = mh.ml.write("job.toml", '[run]\nforward_env = ["KB"]\n')
        args += [str(f)]
        env[b"KB"] = val
    args += ["--", "/usr/bin/python3", "-c", code]
    p = subprocess.run([a if isinstance(a, bytes) else str(a).encode() for a in args], env=env,
                       cwd=str(mh.ml.dir), capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert f"ENV {val.hex()}" in mh.rank_log(0)


# --- 8. sshd MaxSessions 2 and 8 ranks on that host --------------------------------------------

def test_max_sessions_2_host_runs_8_ranks(mh, cluster):
    assert "MaxSessions 2" in (cluster.dir / "h2" / "sshd_config").read_text()
    os.unlink(cached_agent_path(mh))   # so the agent upload happens under MaxSessions 2 too
    p = mh.run("-H", "h2:8", "--workdir", "/tmp", "--",
               "sh", "-c", f'echo "out $RANK $(hostname)"; touch {mh.shared}/r$RANK')
    assert p.returncode == 0, p.stderr
    assert mh.touched() == sorted(f"r{i}" for i in range(8))
    for rank in range(8):
        assert f"out {rank} h2" in mh.rank_log(rank)
    assert len(re.findall(r"^\[h2:\d\] out \d h2$", p.stdout, re.M)) == 8, p.stdout


# --- 9. preflight: nothing starts unless every host is ready ------------------------------------

def test_preflight_missing_program_on_every_host(mh, cluster):
    prog = f"/nonexistent-{mh.ml.marker()}/train"
    p = mh.run("--hostfile", cluster.hostfile, "--procs-per-host", "1", "--workdir", "/tmp",
               "--", prog)
    assert p.returncode == 127, p.stderr  # the program is missing (docs/exit-codes.md), not a lost host
    assert "no rank was started" in p.stderr, p.stderr
    for h in HOSTS:
        assert re.search(rf"^\s*{h}: .*{re.escape(prog)}", p.stderr, re.M), (h, p.stderr)


def test_preflight_unresolvable_host_starts_nothing(mh, cluster):
    # h9 is in no ssh config and no /etc/hosts: its name does not resolve.
    p = mh.run("-H", "h1:1,h9:1,h2:1", "--workdir", "/tmp", "--",
               "sh", "-c", f'touch {mh.shared}/r$RANK')
    assert p.returncode == 255, p.stderr
    assert "no rank was started" in p.stderr
    assert re.search(r"^\s*h9: ", p.stderr, re.M), p.stderr
    assert not re.search(r"^\s*h[12]: ", p.stderr, re.M), p.stderr
    _assert_nothing_started(mh)


def test_preflight_dead_host_starts_nothing(mh, cluster):
    cluster.kill("h4")
    try:
        t0 = time.monotonic()
        p = mh.run("--hostfile", cluster.hostfile, "--procs-per-host", "2", *_touch_cmd(mh))
        assert p.returncode == 255, p.stderr
        assert "no rank was started" in p.stderr
        assert re.search(r"^\s*h4: .*(connect|refused)", p.stderr, re.M | re.I), p.stderr
        assert not re.search(r"^\s*h[123]: ", p.stderr, re.M), p.stderr
        assert time.monotonic() - t0 < 15
        _assert_nothing_started(mh)
    finally:
        cluster.revive("h4")


# --- 10. doctor -------------------------------------------------------------------------------------

def test_doctor_json(mh, cluster):
    p = mh.ml("doctor", "--ssh-config", cluster.ssh_config, "--hostfile", cluster.hostfile,
              "--json", timeout=90)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == 1
    rep = doc["hosts"]
    assert [e["host"] for e in rep] == list(HOSTS)
    for e in rep:
        assert e["ok"] is True, e
        assert e["facts"]["arch"] == "x86_64", e
        assert re.fullmatch(r"\d+\.\d+", e["facts"]["glibc"]), e
        assert abs(e["clock_offset_ms"]) < 500, e   # one kernel clock: only RTT noise
    cluster.kill("h3")
    try:
        p = mh.ml("doctor", "--ssh-config", cluster.ssh_config, "--hostfile", cluster.hostfile,
                  "--json", timeout=90)
        assert p.returncode == 255, p.stderr
        rep = {e["host"]: e for e in json.loads(p.stdout)["hosts"]}
        assert rep["h3"]["ok"] is False and rep["h3"]["stage"] == "connect", rep["h3"]
        assert "h3" in rep["h3"]["problem"]
        assert all(rep[h]["ok"] for h in ("h1", "h2", "h4")), rep
    finally:
        cluster.revive("h3")


# --- 11. bench --check ------------------------------------------------------------------------------

def _bench(mh, binary, cwd, *args, timeout=120):
    try:
        return subprocess.run([str(binary), "bench", "--ssh-config", str(mh.c.ssh_config), *args],
                              env=mh.ml.env, cwd=str(cwd), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mltrain bench did not finish within {timeout}s: {e.stderr!r:.2000}")


def _shared_binary(mh):
    """A copy of the binary the cluster user can execute (bench runs the launcher's own path)."""
    dst = mh.shared / "mltrain"
    shutil.copy2(mh.ml.bin, dst)
    dst.chmod(0o755)
    return dst


def test_bench_check_no_wrong_results(mh, cluster):
    # Binary in a dir the cluster user can read: see the xfail below.
    p = _bench(mh, _shared_binary(mh), "/tmp", "--hostfile", cluster.hostfile,
               "--procs-per-host", "1", "-b", "1M", "-e", "4M", "--check")
    assert p.returncode == 0, p.stderr + p.stdout
    header = [l for l in p.stdout.splitlines() if l.startswith("#") and "#wrong" in l]
    assert header, p.stdout
    cols = header[0].lstrip("#").split()
    rows = [l.split() for l in p.stdout.splitlines()
            if l.strip() and not l.startswith("#") and l.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1 << 20, 2 << 20, 4 << 20], p.stdout
    wrong = cols.index("#wrong")
    assert all(len(r) == len(cols) and r[wrong] == "0" for r in rows), p.stdout
    assert "4 ranks" in p.stdout
    # Across hosts on a power-of-two world the large allreduce is halving/doubling, said in words.
    assert ("# allreduce of messages over 64K: halving/doubling, pairwise exchanges at doubling distances "
            "(ranks on more than one host, 4 ranks a power of two)") in p.stdout, p.stdout


def test_ssh_config_accept_new_is_honoured(mh, cluster):
    cfg = mh.ml.write("ssh_config", cluster.ssh_config.read_text().replace(
        "StrictHostKeyChecking yes", "StrictHostKeyChecking accept-new"))
    blob = (cluster.dir / "h4" / "ssh_host_ed25519_key.pub").read_text().split()[1]
    cluster.forget("h4")
    try:
        p = mh.ml("run", "--ssh-config", cfg, "-H", "h4:1", *_touch_cmd(mh), timeout=60)
        assert p.returncode == 0, p.stderr
        assert blob in cluster.known_hosts.read_text()
    finally:
        cluster.trust("h4")


def test_a_key_without_its_pub_file_logs_in_and_nothing_is_written_beside_it(mh, cluster):
    keys = mh.ml.dir / "keys"
    keys.mkdir(mode=0o700)
    key = keys / "id_cluster"
    shutil.copyfile(cluster.identity, key)
    key.chmod(0o600)
    cfg = mh.ml.write("ssh_config_nopub", cluster.ssh_config.read_text().replace(str(cluster.identity), str(key)))
    p = mh.ml("run", "--ssh-config", cfg, "-H", "h1:1", "--workdir", "/tmp", "--", "echo", "in", timeout=60)
    assert p.returncode == 0 and "in" in p.stdout, p.stderr
    # libssh's automatic login wrote id_cluster.pub here (and a stale one broke a later login).
    assert sorted(x.name for x in keys.iterdir()) == ["id_cluster"]
    # A key the host does not take: the failure names every key offered, and why each did not do.
    other = keys / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    other.with_suffix(".pub").unlink()
    cfg = mh.ml.write("ssh_config_other", cluster.ssh_config.read_text().replace(str(cluster.identity), str(other)))
    p = mh.ml("run", "--ssh-config", cfg, "-H", "h1:1", "--workdir", "/tmp", "--", "echo", "in", timeout=60,
              unset=("SSH_AUTH_SOCK",))
    assert p.returncode != 0
    assert f"h1: authentication failed for mltest@h1; offered: ssh-agent's keys, if one runs, {other} (refused)" in p.stderr, p.stderr
    assert sorted(x.name for x in keys.iterdir()) == ["id_cluster", "id_other"]


def test_damaged_cached_agent_is_replaced(mh):
    path = cached_agent_path(mh)
    st = os.stat(path)
    tmp = path + ".damaged-test"
    try:
        with open(tmp, "wb") as f:
            f.write(b"garbage\n")
        os.chown(tmp, st.st_uid, st.st_gid)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        r = mh.run("-H", "h1:1", "--workdir", "/tmp", "--", "echo", "alive", timeout=60)
        assert r.returncode == 0 and "alive" in r.stdout, r.stderr
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


# --- hosts behind a bastion (ProxyCommand / ProxyJump in the user's ssh config) -----------------

def _jump_config(mh, cluster, how):
    text = cluster.ssh_config.read_text()
    cfg = mh.ml.dir / f"ssh_config_{how}"
    for h in ("h2", "h3"):
        text += (f"\nHost j{h[1]}\n  HostName {_ip(h)}\n  User mltest\n"
                 f"  IdentityFile {cluster.identity}\n  UserKnownHostsFile {cluster.known_hosts}\n"
                 f"  StrictHostKeyChecking yes\n  IdentitiesOnly yes\n")
        text += ("  ProxyJump h1\n" if how == "jump" else
                 f"  ProxyCommand ssh -F {cfg} -o BatchMode=yes -W %h:%p h1\n")
    cfg.write_text(text)
    return cfg


def test_proxycommand_hosts_get_a_master_addr(mh, cluster):
    cfg = _jump_config(mh, cluster, "command")
    probe = 'echo "KV|MA=$MASTER_ADDR|IF=$NCCL_SOCKET_IFNAME|GIF=$GLOO_SOCKET_IFNAME|H=$(hostname)"'
    p = mh.ml("run", "--ssh-config", cfg, "-H", "j2:1,j3:1", "--workdir", "/tmp", "--",
              "sh", "-c", probe, timeout=60)
    assert p.returncode == 0, p.stderr      # the connection itself works
    for rank, h in ((0, "h2"), (1, "h3")):
        line = [l for l in mh.rank_log(rank).splitlines() if l.startswith("KV|")][0]
        kv = dict(x.split("=", 1) for x in line.split("|")[1:])
        assert kv["H"] == h
        assert kv["MA"] == _ip("h2"), f"rank {rank}: MASTER_ADDR {kv['MA']!r}"
        assert kv["IF"] == "eth0" and kv["GIF"] == "eth0", f"rank {rank}: {kv}"


def test_proxyjump_hosts(mh, cluster):
    cfg = _jump_config(mh, cluster, "jump")
    assert subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "j2", "true"],
                          timeout=30).returncode == 0, "OpenSSH itself cannot use the jump config"
    p = mh.ml("run", "--ssh-config", cfg, "-H", "j2:1", "--workdir", "/tmp", "--",
              "sh", "-c", PROBE, timeout=60)
    assert p.returncode == 0, p.stderr


def test_setup_runs_on_every_host_of_a_shared_home(mh, cluster):
    # The hosts share their home (as NFS homes do), and so the folder of setup stamps: a host new
    # to the job said "setup: skipped, nothing changed since it last succeeded here" and never ran it.
    spec = mh.ml.write("setup_shared.toml", f'[run]\ncommand = "true"\nworkdir = "/tmp"\n'
                       f'[setup]\ncommand = "touch {mh.shared}/set-up-on-$(hostname)"\n')
    r = mh.run("-H", "h1:1", spec, timeout=120)
    assert r.returncode == 0, r.stderr
    assert mh.touched() == ["set-up-on-h1"], r.stderr
    r = mh.run("-H", "h1:1,h2:1", spec, timeout=120)
    assert r.returncode == 0, r.stderr
    assert mh.touched() == ["set-up-on-h1", "set-up-on-h2"], r.stderr
    assert "[h1] setup: skipped" in r.stderr and "[h2] setup: skipped" not in r.stderr, r.stderr
