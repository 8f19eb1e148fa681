"""mltrain run on localhost: rank environment, help, dry runs, env overrides, profiles, formatting."""
import json
import re

import pytest

from conftest import run_on_pty

ANSI = re.compile(r"\x1b\[")
VERBS = ["run", "validate", "logs", "ls", "show", "stop", "completions", "knobs"]
RANK_ENV = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RUN_ID", "MLTRAIN_RUN_ID", "MLTRAIN_STORE_ADDR", "MLTRAIN_TOKEN"]


# --- 16. help ---------------------------------------------------------------------------------

def test_top_level_help(ml):
    r = ml("--help")
    assert r.returncode == 0, r.stderr
    assert "Example" in r.stdout
    for verb in VERBS:
        assert verb in r.stdout


@pytest.mark.parametrize("verb", VERBS)
def test_verb_help(ml, verb):
    r = ml(verb, "--help")
    assert r.returncode == 0, r.stderr
    assert "Example" in r.stdout, r.stdout
    assert f"mltrain {verb}" in r.stdout


# --- 1. the rank environment ------------------------------------------------------------------

def test_four_ranks_print_their_env(ml):
    r = ml("run", "-n", "4", "--", "sh", "-c", "echo $RANK $WORLD_SIZE $LOCAL_RANK")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert sorted(lines) == [f"[{i}] {i} 4 {i}" for i in range(4)], r.stdout
    assert not ANSI.search(r.stdout + r.stderr)  # not a TTY


def test_spec_file_runs_with_profile_and_env(ml):
    spec = ml.write("hello.toml", """
name = "hello"
profile = "local"
[run]
command = 'echo "rank $RANK of $WORLD_SIZE: $GREETING"'
[run.env]
GREETING = "hi there"
[cluster]
procs_per_host = 3
""")
    r = ml("run", spec)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [f"[{i}] rank {i} of 3: hi there" for i in range(3)]


def test_examples_hello_runs(ml):
    from conftest import REPO
    r = ml("run", REPO / "examples" / "hello.toml")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 8
    assert "greeting: hi there" in r.stdout


# --- 11. dry run ------------------------------------------------------------------------------

def test_dry_run_json_plan(ml):
    r = ml("run", "-n", "3", "--dry-run", "--json", "--", "python3", "train.py")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["world_size"] == 3
    assert plan["master_addr"] == "127.0.0.1"
    ranks = plan["ranks"]
    assert [x["rank"] for x in ranks] == [0, 1, 2]
    ports = set()
    for x in ranks:
        env = x["env"]
        for k in RANK_ENV:
            assert k in env, (k, env)
        i = x["rank"]
        assert env["RANK"] == str(i)
        assert env["WORLD_SIZE"] == "3"
        assert env["LOCAL_RANK"] == str(i)
        assert env["LOCAL_WORLD_SIZE"] == "3"
        assert env["NODE_RANK"] == env["GROUP_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert 1 <= int(env["MASTER_PORT"]) <= 65535
        ports.add(env["MASTER_PORT"])
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] == env["MLTRAIN_RUN_ID"]
        assert re.fullmatch(r"127\.0\.0\.1:\d+", env["MLTRAIN_STORE_ADDR"])
        assert env["MLTRAIN_TOKEN"] == "<secret>"  # the secret is never printed
    assert len(ports) == 1
    assert not ml.runs_dir.exists() or not ml.run_dirs(), "a dry run created a run folder"
    # Nothing started: the command does not exist, and that is fine for a plan.


def test_dry_run_text_plan(ml):
    r = ml("run", "-n", "2", "--max-restarts", "3", "--dry-run", "--", "sh", "-c", "exit 9")
    assert r.returncode == 0, r.stderr
    for i in range(2):
        line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(f"rank {i}:"))
        assert f"RANK={i} " in line and "WORLD_SIZE=2" in line and f"LOCAL_RANK={i}" in line
        assert "MASTER_ADDR=127.0.0.1" in line and "TORCHELASTIC_MAX_RESTARTS=3" in line
        assert "MLTRAIN_TOKEN=<secret>" in line
        assert not re.search(r"MLTRAIN_TOKEN=[0-9a-f]{16}", line)
    assert not ml.run_dirs()


def test_dry_run_starts_nothing(ml, tmp_path):
    flag = tmp_path / "started"
    r = ml("run", "-n", "2", "--dry-run", "--", "touch", flag)
    assert r.returncode == 0, r.stderr
    assert not flag.exists()
    assert not ml.run_dirs()


def test_dry_run_ps_job_with_a_server_only_host(ml):
    ml.write("hosts.txt", "a slots=2\nb slots=2 role=both\nsrv role=server slots=8\n")
    spec = ml.write("job.toml", """
[run]
command = 'python3 train.py'
[cluster]
hostfile = 'hosts.txt'
oversubscribe = true
nprocs = 6
[ps]
servers_per_host = 2
sync = false
partition_bytes = '1M'
[ps.optimizer]
lr = 0.1
momentum = 0.9
""")
    r = ml("run", spec, "--dry-run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("run job: 6 ranks on 2 hosts + 1 server-only host\n"), out
    assert "\nps:      4 servers on b, srv (2 each), async, optimizer sgd lr=0.1 momentum=0.9, partition 1 MiB\n" in out
    assert "\nhost a (node 0): ranks 0 1 2\n" in out
    assert "\nhost b (node 1): ranks 3 4 5; ps servers: 2\n" in out
    assert "\nhost srv (server only): ps servers: 2\n" in out
    rank_lines = [ln for ln in out.splitlines() if ln.strip().startswith("rank ")]
    assert len(rank_lines) == 6  # no rank on the server-only host, even oversubscribed
    for line in rank_lines:
        for kv in ("DMLC_ROLE=worker", "DMLC_NUM_WORKER=6", "DMLC_NUM_SERVER=4", "MLTRAIN_PS_SYNC=0",
                   "MLTRAIN_PS_PARTITION_BYTES=1048576", "GROUP_WORLD_SIZE=2"):
            assert f" {kv} " in line + " ", (kv, line)

    plan = json.loads(ml("run", spec, "--dry-run", "--json").stdout)
    assert [h["name"] for h in plan["hosts"]] == ["a", "b", "srv"]
    assert [h["node_rank"] for h in plan["hosts"]] == [0, 1, -1]
    assert plan["hosts"][2]["ranks"] == []
    assert plan["world_size"] == 6
    assert not ml.run_dirs()


def test_dry_run_without_ps_shows_no_servers(ml):
    r = ml("run", "-n", "2", "--dry-run", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "ps:" not in r.stdout and "ps servers" not in r.stdout and "DMLC_" not in r.stdout


def test_validate_json_is_a_plan(ml):
    spec = ml.write("job.toml", "[run]\ncommand = 'true'\n[cluster]\nnprocs = 2\n")
    r = ml("validate", "--json", spec)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["world_size"] == 2
    assert not ml.run_dirs()


# --- 14. environment --------------------------------------------------------------------------

def test_cli_env_beats_spec_env(ml):
    spec = ml.write("job.toml", """
[run]
command = 'echo "K=$K L=$L"'
[run.env]
K = "spec"
L = "spec"
""")
    r = ml("run", spec, "--env", "K=cli")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0] K=cli L=spec"
    plan = json.loads(ml("run", spec, "--env", "K=cli", "--dry-run", "--json").stdout)
    assert plan["ranks"][0]["env"]["K"] == "cli"


def test_cli_env_never_overrides_rank_env(ml):
    r = ml("run", "-n", "2", "--env", "RANK=7", "--env", "WORLD_SIZE=9", "--",
           "sh", "-c", "echo $RANK $WORLD_SIZE")
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert "--env: env 'RANK' is set by mltrain" in r.stderr


def test_cli_env_reserved_is_an_error(ml):
    r = ml("run", "-n", "1", "--env", "RANK=7", "--", "true")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "RANK" in r.stderr


def test_cli_env_invalid_name_is_an_error(ml):
    r = ml("run", "-n", "1", "--env", "1BAD=x", "--", "true")
    assert r.returncode == 2, (r.stdout, r.stderr)


def test_cli_env_without_equals_is_an_error(ml):
    r = ml("run", "-n", "1", "--env", "NOEQ", "--", "true")
    assert r.returncode == 2
    assert r.stderr.startswith("mltrain: error: --env 'NOEQ'")


def test_forward_env_globs(ml):
    spec = ml.write("job.toml", """
[run]
command = 'true'
forward_env = ["E2E_FWD_*"]
""")
    r = ml("run", spec, "--dry-run", "--json",
           env={"E2E_FWD_A": "a", "E2E_FWD_B": "b c", "E2E_OTHER": "x"})
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["ranks"][0]["env"]
    assert env.get("E2E_FWD_A") == "a" and env.get("E2E_FWD_B") == "b c"
    assert "E2E_OTHER" not in env


TRICKY = {
    "SPACES": "  two  spaces  and tab\tend ",
    "QUOTES": "it's \"quoted\" `tick`",
    "DOLLAR": "$HOME ${RANK} $(id) \\n",
    "NEWLINE": "line1\nline2\n",
    "UNICODE": "héllo ✓",
    "EMPTY": "",
}


@pytest.mark.parametrize("via", ["cli", "spec"])
def test_env_values_arrive_byte_exact(ml, tmp_path, via):
    out = tmp_path / "out"
    out.mkdir()
    script = "for k in " + " ".join(TRICKY) + '; do printenv "$k" > "$OUTDIR/$k.$RANK"; done'
    if via == "cli":
        args = []
        for k, v in TRICKY.items():
            args += ["--env", f"{k}={v}"]
        r = ml("run", "-n", "2", *args, "--env", f"OUTDIR={out}", "--", "sh", "-c", script)
    else:
        def q(v):  # a TOML basic string
            return json.dumps(v, ensure_ascii=False)
        body = "\n".join(f"{k} = {q(v)}" for k, v in TRICKY.items())
        spec = ml.write("job.toml", f"[run]\ncommand = {q(script)}\n[cluster]\nnprocs = 2\n"
                                    f"[run.env]\nOUTDIR = {q(str(out))}\n{body}\n")
        r = ml("run", spec)
    assert r.returncode == 0, r.stderr
    for k, v in TRICKY.items():
        for rank in range(2):
            got = (out / f"{k}.{rank}").read_bytes()
            assert got == (v + "\n").encode(), (k, got)


# --- 13. profiles -----------------------------------------------------------------------------

def _spec_of_latest(ml):
    return json.loads(ml("show", "--json").stdout)["spec_text"]


def test_builtin_profile_merges_under_spec(ml):
    spec = ml.write("job.toml", """
profile = "local"
[run]
command = 'true'
""")
    env = json.loads(ml("run", spec, "--dry-run", "--json").stdout)["ranks"][0]["env"]
    assert env["MLTRAIN_COMM_BACKEND"] == "tcp"  # from the profile
    spec2 = ml.write("job2.toml", """
profile = "local"
[run]
command = 'true'
[comm]
backend = "auto"
""")
    env = json.loads(ml("run", spec2, "--dry-run", "--json").stdout)["ranks"][0]["env"]
    assert env["MLTRAIN_COMM_BACKEND"] == "auto"  # the spec wins
    # The profile's grace period shows in the resolved spec of a real run.
    assert ml("run", spec).returncode == 0
    assert re.search(r"grace_period = '3(\.0)?s'", _spec_of_latest(ml))


def _user_profile(ml, name="team"):
    d = ml.config / "mltrain" / "profiles"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.toml"
    p.write_text("""
[run]
grace_period = "7s"
[run.env]
FROM_PROFILE = "p"
SHARED = "profile"
[comm]
backend = "tcp"
""")
    return p


def _check_profile_merge(ml, profile_line):
    spec = ml.write("job.toml", f"""
{profile_line}
[run]
command = 'true'
[run.env]
SHARED = "spec"
FROM_SPEC = "s"
""")
    r = ml("run", spec, "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["ranks"][0]["env"]
    assert env["FROM_PROFILE"] == "p"
    assert env["FROM_SPEC"] == "s"
    assert env["SHARED"] == "spec"
    assert env["MLTRAIN_COMM_BACKEND"] == "tcp"


def test_user_profile_by_name(ml):
    _user_profile(ml)
    _check_profile_merge(ml, 'profile = "team"')


def test_profile_by_path(ml):
    p = _user_profile(ml, "elsewhere")
    moved = ml.dir / "profs" / "mine.toml"
    moved.parent.mkdir()
    p.rename(moved)
    _check_profile_merge(ml, f'profile = "{moved}"')


def test_profile_flag_for_adhoc_run(ml):
    _user_profile(ml)
    r = ml("run", "-n", "1", "--profile", "team", "--dry-run", "--json", "--", "true")
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["ranks"][0]["env"]
    assert env["FROM_PROFILE"] == "p" and env["MLTRAIN_COMM_BACKEND"] == "tcp"


# --- 15. output formatting --------------------------------------------------------------------

def test_no_ansi_when_not_a_tty_or_no_color(ml):
    for env in ({}, {"NO_COLOR": "1"}):
        r = ml("run", "-n", "2", "--", "sh", "-c", "echo out; echo err >&2", env=env)
        assert r.returncode == 0
        assert not ANSI.search(r.stdout), r.stdout
        assert not ANSI.search(r.stderr), r.stderr
    r = ml("--color", "always", "run", "-n", "1", "--", "echo", "x")
    assert ANSI.search(r.stdout)  # the switch works, so the checks above mean something
    r = ml("--color", "always", "run", "-n", "1", "--", "echo", "x", env={"NO_COLOR": "1"})
    # An explicit --color always is stronger than NO_COLOR (as in most tools); either is fine
    # here, but the line itself must be intact.
    assert ANSI.sub("", r.stdout).replace("[0m", "").strip().endswith("x")


def test_no_prefix(ml):
    r = ml("run", "-n", "3", "--no-prefix", "--", "sh", "-c", "echo line-$RANK; echo err-$RANK >&2")
    assert r.returncode == 0
    assert sorted(r.stdout.splitlines()) == ["line-0", "line-1", "line-2"]
    assert {f"err-{i}" for i in range(3)} <= set(r.stderr.splitlines())


def test_stderr_lines_go_to_stderr_prefixed(ml):
    r = ml("run", "-n", "2", "--", "sh", "-c", "echo to-out; echo to-err >&2")
    assert sorted(r.stdout.splitlines()) == ["[0] to-out", "[1] to-out"]
    assert "[0] to-err" in r.stderr.splitlines() and "[1] to-err" in r.stderr.splitlines()


def test_logs_ranks_console_filter(ml):
    spec = ml.write("job.toml", """
[run]
command = 'echo "hello $RANK"'
[cluster]
nprocs = 4
[logs]
ranks = "0"
""")
    r = ml("run", spec)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[0] hello 0"]
    (d,) = ml.run_dirs()
    for i in range(4):
        assert (d / f"rank-{i}.log").read_text() == f"hello {i}\n"


def test_ranks_flag_console_filter(ml):
    r = ml("run", "-n", "4", "--ranks", "1,3", "--", "sh", "-c", 'echo "hi $RANK"')
    assert sorted(r.stdout.splitlines()) == ["[1] hi 1", "[3] hi 3"]
    (d,) = ml.run_dirs()
    assert (d / "rank-0.log").read_text() == "hi 0\n"


def test_timestamps(ml):
    r = ml("run", "-n", "1", "--timestamps", "--", "echo", "stamped")
    assert r.returncode == 0
    (line,) = r.stdout.splitlines()
    assert line.endswith("stamped") and re.search(r"\d\d:\d\d:\d\d", line), line


def test_env_flag_before_spec(ml):
    spec = ml.write("job.toml", "[run]\ncommand = 'echo \"A=$A\"'\n")
    r = ml("run", "--env", "A=1", spec)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0] A=1"


def test_env_flag_after_spec(ml):
    spec = ml.write("job.toml", "[run]\ncommand = 'echo \"A=$A\"'\n")
    r = ml("run", spec, "--env", "A=1", "-e", "B=2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0] A=1"


# --- the rank environment of a real run -------------------------------------------------------

def test_real_rank_env_matches_the_plan(ml, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    r = ml("run", "-n", "3", "--max-restarts", "1", "--", "sh", "-c", f'env > "{out}/$RANK"')
    assert r.returncode == 0, r.stderr
    envs = []
    for i in range(3):
        env = dict(ln.split("=", 1) for ln in (out / str(i)).read_text().splitlines() if "=" in ln)
        envs.append(env)
        for k in RANK_ENV:
            assert k in env, k
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == \
            (str(i), str(i), "3", "3")
        assert env["NODE_RANK"] == env["GROUP_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "1" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert re.fullmatch(r"[0-9a-f]{16,}", env["MLTRAIN_TOKEN"]), env["MLTRAIN_TOKEN"]
    (d,) = ml.run_dirs()
    for k in ("MASTER_PORT", "MLTRAIN_STORE_ADDR", "MLTRAIN_TOKEN", "MLTRAIN_RUN_ID", "TORCHELASTIC_RUN_ID"):
        assert len({e[k] for e in envs}) == 1, k  # one job, one value
    assert envs[0]["MLTRAIN_RUN_ID"] == envs[0]["TORCHELASTIC_RUN_ID"] == d.name
    # The job's secret is in no record, log or listing.
    token = envs[0]["MLTRAIN_TOKEN"]
    for f in d.iterdir():
        assert token not in f.read_text(errors="replace"), f
    assert token not in ml("show", "--json").stdout + ml("ls", "--json").stdout


def test_two_runs_get_different_ports_and_tokens(ml, tmp_path):
    vals = []
    for i in range(2):
        r = ml("run", "-n", "1", "--", "sh", "-c", 'echo "$MASTER_PORT $MLTRAIN_TOKEN"')
        vals.append(r.stdout.split()[1:])
    assert vals[0][1] != vals[1][1]


def test_prefix_template(ml):
    spec = ml.write("job.toml", """
[run]
command = 'echo hi'
[cluster]
nprocs = 2
[logs]
prefix = "{node}/{rank}@{host}:{local_rank}|"
""")
    r = ml("run", spec)
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert [ln.split("|")[0] for ln in lines] == ["0/0@localhost:0", "0/1@localhost:1"], lines
    assert all(ln.split("|", 1)[1].strip() == "hi" for ln in lines)
    spec2 = ml.write("job2.toml", "[run]\ncommand = 'echo hi'\n[logs]\nprefix = false\n")
    assert ml("run", spec2).stdout == "hi\n"


def test_color_on_a_tty_and_no_color(ml):
    rc, out = run_on_pty(ml, ["run", "-n", "2", "--", "echo", "hi"])
    assert rc == 0
    assert b"\x1b[" in out, out  # auto: colour on a terminal
    rc, out = run_on_pty(ml, ["run", "-n", "2", "--", "echo", "hi"], env={"NO_COLOR": "1"})
    assert rc == 0 and b"hi" in out
    assert b"\x1b[" not in out, out
    rc, out = run_on_pty(ml, ["--color", "never", "run", "-n", "2", "--", "echo", "hi"])
    assert b"\x1b[" not in out, out


def test_dry_run_with_detach_starts_nothing(ml, tmp_path):
    flag = tmp_path / "started"
    r = ml("run", "-d", "--dry-run", "-n", "1", "--", "touch", flag)
    assert r.returncode == 0, r.stderr
    import time as _time
    _time.sleep(0.5)
    assert not flag.exists() and not ml.run_dirs()


def test_detach_json(ml):
    r = ml("run", "-d", "--json", "-n", "1", "--", "true", timeout=10)
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    run_id = doc.get("run_id") or doc.get("id")
    assert run_id and ml("logs", "-f", run_id, timeout=10).returncode == 0
