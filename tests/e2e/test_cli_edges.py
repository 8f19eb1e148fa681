"""CLI and spec edges a new user hits (issue 9): empty host lists, contradictory specs, unknown prefix
placeholders, console ranks out of range, `run spec --`, -x, the slot rule and --oversubscribe,
peer launchers' flags, torchrun's extra variables and its error file, validate's host check,
per-verb help and the knobs table. All on localhost; the multi-host side is test_multihost_cli.py.
"""
import json
import re

import pytest

RUN = "[run]\ncommand = 'echo from-spec'\n"


def _error(r, code=2):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("mltrain: error: "), r.stderr
    return r.stderr


# --- 2. empty host lists are errors, never a silent localhost run --------------------------------

@pytest.mark.parametrize("content", ["", "\n\n", "# only a comment\n  # another\n"],
                         ids=["empty", "blank", "comments"])
def test_hostfile_without_hosts_is_an_error(ml, content):
    hf = ml.write("hosts.txt", content)
    flag = ml.dir / "ran"
    r = ml("run", "--hostfile", hf, "--", "touch", flag)
    err = _error(r)
    assert f"hostfile {hf} has no hosts" in err
    assert not flag.exists() and not ml.run_dirs()


def test_empty_host_flag_is_an_error(ml):
    flag = ml.dir / "ran"
    err = _error(ml("run", "-H", "", "--", "touch", flag))
    assert "-H is empty" in err
    assert not flag.exists() and not ml.run_dirs()


def test_empty_hosts_in_spec_is_a_located_error(ml):
    ml.write("job.toml", RUN + "[cluster]\nhosts = []\n")
    err = _error(ml("validate", "job.toml"))
    assert re.search(r"job\.toml:4:\d+: \[cluster\] hosts is empty", err), err


# --- 6. located errors: command and argv, prefix placeholders, --ranks ---------------------------

def test_command_and_argv_together_is_a_located_error(ml):
    ml.write("job.toml", "[run]\ncommand = 'echo a'\nargv = ['echo', 'b']\n")
    for verb in ("validate", "run"):
        err = _error(ml(verb, "job.toml"))
        assert re.search(r"job\.toml:3:\d+: \[run\] has both 'command' \(at job\.toml:2:\d+\) and 'argv'", err), err
    assert not ml.run_dirs()


def test_profile_argv_under_spec_command_is_fine(ml):
    # A spec may replace its profile's argv with a command: only one document holding both is wrong.
    ml.write("prof.toml", "[run]\nargv = ['echo', 'profile']\n")
    ml.write("job.toml", "profile = 'prof.toml'\n" + RUN)
    r = ml("run", "job.toml")
    assert r.returncode == 0, r.stderr
    assert "from-spec" in r.stdout


def test_unknown_prefix_placeholder_is_a_located_error(ml):
    ml.write("job.toml", RUN + "[logs]\nprefix = '{hostname} |'\n")
    err = _error(ml("validate", "job.toml"))
    assert re.search(r"job\.toml:4:\d+: prefix .*unknown placeholder '\{hostname\}'", err), err
    assert "did you mean '{host}'" in err
    assert "{rank} {host} {local_rank} {node}" in err


def test_known_prefix_placeholders_still_work(ml):
    ml.write("job.toml", RUN + "[logs]\nprefix = '<{node}/{local_rank}@{rank}>'\n")
    r = ml("run", "job.toml")
    assert r.returncode == 0, r.stderr
    assert "<0/0@0> from-spec" in r.stdout


def test_console_rank_out_of_range(ml):
    err = _error(ml("run", "-n", "2", "--ranks", "5", "--", "true"))
    assert "rank 5 is not in this job, which has 2 ranks" in err
    assert "0 to 1" in err
    assert not ml.run_dirs()
    ml.write("job.toml", RUN + "[cluster]\nnprocs = 2\n[logs]\nranks = '1,3'\n")
    err = _error(ml("validate", "job.toml"))
    assert re.search(r"job\.toml:6:\d+: rank 3 is not in this job", err), err


# --- 17. `run spec.toml --` with nothing after it runs the spec --------------------------------

def test_empty_command_after_dashes_keeps_the_spec(ml):
    ml.write("job.toml", RUN)
    r = ml("run", "job.toml", "--")
    assert r.returncode == 0, r.stderr
    assert "from-spec" in r.stdout


# --- 8. -x forwards or sets a variable ---------------------------------------------------------

def test_x_forwards_and_sets(ml):
    r = ml("run", "-x", "FWD_ME", "-x", "SET_ME=given", "--", "sh", "-c", 'echo "v=$FWD_ME,$SET_ME"',
           env={"FWD_ME": "from-launcher"})
    assert r.returncode == 0, r.stderr
    assert "v=from-launcher,given" in r.stdout


def test_x_of_an_unset_variable_is_an_error(ml):
    err = _error(ml("run", "-x", "NOT_SET_ANYWHERE", "--", "true"), 2)
    assert "-x NOT_SET_ANYWHERE" in err and "not set" in err
    assert "-x NOT_SET_ANYWHERE=VALUE" in r_hint(err)


def r_hint(err):
    return err.split("mltrain: hint:", 1)[1] if "mltrain: hint:" in err else ""


def test_x_cannot_set_a_contract_variable(ml):
    err = _error(ml("run", "-x", "RANK=3", "--", "true"))
    assert "RANK" in err and "set by mltrain" in err


# --- 16. one slot rule: a host without a count has 1 slot; --oversubscribe to exceed ------------

def test_hosts_without_counts_have_one_slot(ml):
    err = _error(ml("run", "--dry-run", "-H", "a,b", "-n", "5", "--", "true"))
    assert "asked for 5 ranks but the hosts have only 2 slots" in err
    assert "--oversubscribe" in r_hint(err)


def test_hostfile_and_host_list_follow_the_same_rule(ml):
    hf = ml.write("hosts.txt", "a\nb\n")
    err = _error(ml("run", "--dry-run", "--hostfile", hf, "-n", "3", "--", "true"))
    assert "asked for 3 ranks but the hosts have only 2 slots" in err


def test_oversubscribe_spreads_the_extra_ranks(ml):
    r = ml("run", "--dry-run", "--json", "-H", "a,b", "-n", "5", "--oversubscribe", "--", "true")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    per_host = [sum(1 for x in plan["ranks"] if x["host"] in (i, h["name"]))
                for i, h in enumerate(plan["hosts"])]
    assert per_host == [3, 2], plan
    ml.write("job.toml", RUN + "[cluster]\nhosts = ['a:1', 'b:1']\nnprocs = 3\noversubscribe = true\n")
    r = ml("run", "--dry-run", "--json", "job.toml")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["ranks"]) == 3


def test_localhost_without_hosts_still_takes_any_n(ml):
    r = ml("run", "-n", "3", "--", "true")
    assert r.returncode == 0, r.stderr


# --- 18. peer launchers' flags ------------------------------------------------------------------

def test_np_means_n(ml):
    r = ml("run", "-np", "3", "--", "sh", "-c", 'echo "w=$WORLD_SIZE"')
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("w=3") == 3


@pytest.mark.parametrize("flag", ["--nproc-per-node", "--nproc_per_node"])
def test_nproc_per_node_means_procs_per_host(ml, flag):
    r = ml("run", f"{flag}=2", "--", "sh", "-c", 'echo "lw=$LOCAL_WORLD_SIZE"')
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("lw=2") == 2


@pytest.mark.parametrize("flag", ["--master-port", "--master_port"])
def test_master_port_flag(ml, flag):
    r = ml("run", flag, "29517", "--", "sh", "-c", 'echo "p=$MASTER_PORT"')
    assert r.returncode == 0, r.stderr
    assert "p=29517" in r.stdout


@pytest.mark.parametrize("flag,hint", [("--nnodes", "-H a,b or --hostfile"),
                                       ("--master_addr", "MASTER_ADDR"),
                                       ("--node-rank", "NODE_RANK")])
def test_peer_flags_without_an_equal_get_a_hint(ml, flag, hint):
    err = _error(ml("run", flag, "2", "--", "true"))
    assert f"'{flag}' is not a flag of mltrain" in err
    assert hint in r_hint(err)


def test_peer_flags_after_dashes_belong_to_the_command(ml):
    r = ml("run", "--", "echo", "-np", "--nnodes")
    assert r.returncode == 0, r.stderr
    assert "-np --nnodes" in r.stdout


# --- 18. torchrun's extra variables and its error file -----------------------------------------

def test_torchrun_variables(ml):
    r = ml("run", "-n", "2", "--", "sh", "-c",
           'echo "env $RANK ${OMP_NUM_THREADS:-unset} $ROLE_NAME $GROUP_WORLD_SIZE $TORCHELASTIC_ERROR_FILE"')
    assert r.returncode == 0, r.stderr
    lines = sorted(l.split("env ", 1)[1] for l in r.stdout.splitlines() if "env " in l)
    run_dir = ml.run_dirs()[0]
    assert lines == [f"{i} 1 default 1 {run_dir}/rank-{i}.error.json" for i in range(2)], lines


def test_omp_num_threads_of_the_user_wins(ml):
    sh = ["sh", "-c", 'echo "omp=${OMP_NUM_THREADS:-unset}"']
    r = ml("run", "-n", "2", "--", *sh, env={"OMP_NUM_THREADS": "3"})
    assert r.stdout.count("omp=3") == 2, r.stdout
    r = ml("run", "-n", "2", "--env", "OMP_NUM_THREADS=5", "--", *sh, unset=("OMP_NUM_THREADS",))
    assert r.stdout.count("omp=5") == 2, r.stdout
    # One rank per host: nothing to oversubscribe, so left alone (as torchrun does).
    r = ml("run", "-n", "1", "--", *sh, unset=("OMP_NUM_THREADS",))
    assert "omp=unset" in r.stdout, r.stdout


def test_failure_summary_shows_the_error_file(ml):
    ml.write("rec.py", """
import json, os, sys
if os.environ["RANK"] == "1":
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
        json.dump({"message": {"message": "ValueError: lr must be positive",
                               "extraInfo": {"py_callstack": "Traceback", "timestamp": "0"}}}, f)
    sys.exit(3)
""")
    r = ml("run", "-n", "2", "--", "/usr/bin/python3", "rec.py")
    assert r.returncode == 3, r.stderr
    assert re.search(r"rank 1's error file \(.*rank-1\.error\.json on localhost\):\n    ValueError: lr must be positive",
                     r.stderr), r.stderr


# --- 9. validate checks what it can without connecting -----------------------------------------

def test_validate_names_a_host_that_does_not_resolve(ml):
    err = _error(ml("validate", "-H", "localhost,nosuch-host-q9.invalid", "--", "true"), 255)
    assert "nosuch-host-q9.invalid" in err and "does not resolve" in err


def test_validate_says_what_it_did_not_check(ml):
    cfg = ml.write("ssh_config", "Host box1\n  HostName 127.0.0.1\n")
    r = ml("validate", "--ssh-config", cfg, "-H", "box1:2", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "box1: resolves to 127.0.0.1 (HostName 127.0.0.1" in r.stdout
    assert "not checked:" in r.stdout and "mltrain doctor" in r.stdout


# --- 20. each verb's help lists only its flags; knobs stays in columns --------------------------

def test_help_lists_only_flags_that_apply(ml):
    doctor = ml("doctor", "--help").stdout
    validate = ml("validate", "--help").stdout
    run = ml("run", "--help").stdout
    bench = ml("bench", "--help").stdout
    for text in (doctor, validate, run, bench):
        assert "--hostfile" in text and "--oversubscribe" in text
    for flag in ("--timeout", "--max-restarts", "--no-prefix", "--timestamps", "--ranks", "--env"):
        assert flag not in doctor, flag
    for flag in ("--no-prefix", "--timestamps", "--ranks", "--detach", "--dry-run"):
        assert flag not in validate, flag
    for flag in ("--no-prefix", "--ranks", "-x", "--dry-run", "--detach"):
        assert flag in run, flag


def test_knobs_meaning_wraps_in_its_column(ml):
    r = ml("knobs", env={"COLUMNS": "90"})
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    start = lines[0].index("MEANING")
    # Only a single word too long for the column may pass the edge.
    assert all(len(l) <= 90 or len(l[start:].split()) == 1 for l in lines), [l for l in lines if len(l) > 90]
    continued = [l for l in lines[1:] if l.startswith(" ")]
    assert continued, "nothing wrapped at 90 columns"
    assert all(len(l) - len(l.lstrip(" ")) == start for l in continued)


def test_exec_on_this_host_prefixes_by_host_and_returns_the_commands_code(ml):
    r = ml("exec", "--", "sh", "-c", "echo here; pwd; exit 7")
    assert r.returncode == 7, r.stderr
    assert r.stdout.splitlines() == ["[localhost] here", f"[localhost] {ml.dir}"], r.stdout
    assert "localhost: the command failed with exit code 7" in r.stderr, r.stderr
    r = ml("exec", "--no-prefix", "--", "echo", "plain")
    assert r.returncode == 0 and r.stdout == "plain\n", (r.stdout, r.stderr)


def test_a_host_that_cannot_be_reached_is_named_once(ml):
    # "mltrain: h3: h3: cannot connect: ..." in queue and gc --hosts; "connect: h3: ..." in doctor.
    for args in (["queue"], ["gc", "--hosts"], ["doctor"]):
        r = ml(*args, "-H", "nosuchhost.invalid:1", timeout=60)
        assert "nosuchhost.invalid: nosuchhost.invalid" not in r.stdout + r.stderr, (args, r.stdout + r.stderr)
        assert "cannot connect" in r.stdout + r.stderr, (args, r.stdout + r.stderr)


# Exec's one-word shell form.
def test_exec_runs_one_word_as_a_shell_command_line(ml):
    r = ml("exec", "--", "cd / && pwd && echo two words")
    assert r.returncode == 0, r.stderr
    assert "/" in r.stdout.split() and "two words" in r.stdout, r.stdout
    spec = ml.write("job.toml", '[run]\ncommand = "true"\n')
    r = ml("exec", spec, "--", "cd ~ && pwd")
    assert r.returncode == 0 and "rename the job" not in r.stderr, r.stderr
    assert r.stdout.strip(), r.stdout
    # A plain word is still a program: its absence is the usual 127.
    r = ml("exec", "--", "no-such-program-xyz")
    assert r.returncode == 127, r.stderr


# Names derived from a command or a file.
def test_names_derived_from_a_command_or_a_file_are_made_valid(ml):
    r = ml("run", "--dry-run", "--", "echo hi there")
    assert r.returncode == 0 and "rename the job" not in r.stderr, r.stderr
    assert r.stdout.startswith("run echo:"), r.stdout
    spec = ml.write("my job.toml", '[run]\ncommand = "echo derived-ok"\n')
    r = ml("run", spec)
    assert r.returncode == 0, r.stderr
    assert "derived-ok" in r.stdout
    assert json.loads(ml("show", "--json").stdout)["name"] == "my-job"
    # A name the user chose is still checked.
    bad = ml.write("bad.toml", 'name = "my job"\n[run]\ncommand = "true"\n')
    r = ml("run", bad)
    assert r.returncode == 2 and "rename the job" in r.stderr, r.stderr


# Exec and latest, the kind column, the exec summary.
def test_exec_is_a_kind_in_ls_and_does_not_take_latest_from_cp(ml):
    spec = ml.write("keep.toml", f'[run]\ncommand = "echo kept > out.txt"\nworkdir = "{ml.dir}"\n')
    r = ml("run", spec)
    assert r.returncode == 0, r.stderr
    run_id = json.loads(ml("show", "--json").stdout)["id"]
    r = ml("exec", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "succeeded on 1 host" in r.stderr and "rank" not in r.stderr.split("succeeded")[0], r.stderr
    lines = ml("ls").stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATUS", "KIND"], lines[0]
    assert lines[1].split()[2] == "exec" and lines[2].split()[2] == "run", lines
    assert json.loads(ml("show", "--json").stdout)["kind"] == "exec"
    dest = ml.dir / "copied.txt"
    r = ml("cp", "latest:out.txt", dest)
    assert r.returncode == 0, r.stderr
    assert dest.read_text() == "kept\n"
    assert "an exec" in r.stderr and run_id in r.stderr, r.stderr
