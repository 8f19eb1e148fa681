"""Malformed job specs, hostfiles and flags: exit 2, one `mltrain: error: WHERE: ...` line, fast.

Each case is (id, files, expected location regex, expected text fragment). `files` maps a file
name to its content; job.toml is the spec given to `validate` and `run`. A location of
r"job\\.toml:3:\\d+" means line 3 of the spec; hostfile errors name the hostfile's file:line.
"""
import re
import time

import pytest

RUN = "[run]\ncommand = 'true'\n"
BAD_HOSTFILE_SPEC = RUN + "[cluster]\nhostfile = 'hosts.txt'\n"
FILTER_SPEC = RUN + "[cluster]\nhosts = ['a:2', 'b:2']\n"


ANY = r"\d+"


def loc(line, col=None):
    return rf"job\.toml:{line}:{ANY if col is None else col}"


def hloc(line, col=None):
    return rf"(\S*/)?hosts\.txt:{line}:{ANY if col is None else col}"


CASES = [
    # unknown keys, with a suggestion
    ("unknown-top-key", {"job.toml": "nmae = 'x'\n" + RUN}, loc(1, 1), "did you mean 'name'"),
    ("unknown-run-key", {"job.toml": "[run]\ncomand = 'true'\n"}, loc(2, 1), "did you mean 'command'"),
    ("unknown-section", {"job.toml": RUN + "[clustr]\nnprocs = 2\n"}, loc(3), "did you mean 'cluster'"),
    ("unknown-cluster-key", {"job.toml": RUN + "[cluster]\nproc_per_host = 2\n"}, loc(4, 1),
     "did you mean 'procs_per_host'"),
    ("unknown-logs-key", {"job.toml": RUN + "[logs]\ntimestamp = true\n"}, loc(4, 1),
     "did you mean 'timestamps'"),
    # wrong types
    ("name-int", {"job.toml": "name = 3\n" + RUN}, loc(1), "must be a string"),
    ("command-array", {"job.toml": "[run]\ncommand = ['true']\n"}, loc(2), "must be a string"),
    ("argv-string", {"job.toml": "[run]\nargv = 'echo hi'\n"}, loc(2), "array"),
    ("argv-ints", {"job.toml": "[run]\nargv = ['echo', 2]\n"}, loc(2), "only strings"),
    ("max-restarts-string", {"job.toml": RUN + "max_restarts = '2'\n"}, loc(3), "integer"),
    ("timestamps-string", {"job.toml": RUN + "[logs]\ntimestamps = 'yes'\n"}, loc(4), "true or false"),
    ("forward-env-string", {"job.toml": RUN + "forward_env = 'FOO_*'\n"}, loc(3), "array"),
    ("run-not-table", {"job.toml": "run = 3\n"}, loc(1), "table"),
    ("env-value-table", {"job.toml": RUN + "[run.env]\nX = { a = 1 }\n"}, loc(4), "env 'X'"),
    # out of range
    ("max-restarts-negative", {"job.toml": RUN + "max_restarts = -1\n"}, loc(3), "out of range"),
    ("max-restarts-huge", {"job.toml": RUN + "max_restarts = 5000\n"}, loc(3), "out of range"),
    ("procs-per-host-zero", {"job.toml": RUN + "[cluster]\nprocs_per_host = 0\n"}, loc(4), "out of range"),
    ("nprocs-zero", {"job.toml": RUN + "[cluster]\nnprocs = 0\n"}, loc(4), "out of range"),
    ("master-port-big", {"job.toml": RUN + "[comm]\nmaster_port = 70000\n"}, loc(4), "out of range"),
    ("master-port-word", {"job.toml": RUN + "[comm]\nmaster_port = 'any'\n"}, loc(4), "master_port"),
    ("comm-mode-choice", {"job.toml": RUN + "[comm]\nmode = 'allreduc'\n"}, loc(4), "did you mean 'allreduce'"),
    ("comm-backend-choice", {"job.toml": RUN + "[comm]\nbackend = 'ncl'\n"}, loc(4), "not one of"),
    ("strict-host-keys", {"job.toml": RUN + "[ssh]\nstrict_host_keys = 'maybe'\n"}, loc(4), "not one of"),
    ("ssh-port-zero", {"job.toml": RUN + "[ssh]\nport = 0\n"}, loc(4), "out of range"),
    ("logs-ranks-bad", {"job.toml": RUN + "[logs]\nranks = '0-x'\n"}, loc(4), "rank list"),
    # [sync] and [setup]
    ("sync-unknown-key", {"job.toml": RUN + "[sync]\nexclud = ['*.log']\n"}, loc(4, 1), "did you mean 'exclude'"),
    ("sync-remote-dir-relative", {"job.toml": RUN + "[sync]\nremote_dir = 'work/job'\n"}, loc(4),
     "not a path on the hosts"),
    ("sync-files-dst-outside", {"job.toml": RUN + "[[sync.files]]\nsrc = 'job.toml'\ndst = '../up'\n"}, loc(3),
     "outside the synced folder"),
    ("sync-files-not-tables", {"job.toml": RUN + "[sync]\nfiles = ['a']\n"}, loc(4), "table"),
    ("sync-pull-from-choice", {"job.toml": RUN + "[sync]\npull_from = 'rank1'\n"}, loc(4), "not one of"),
    ("setup-when-choice", {"job.toml": RUN + "[setup]\ncommand = 'true'\nwhen = 'sometimes'\n"}, loc(5),
     "not one of"),
    ("setup-command-empty", {"job.toml": RUN + "[setup]\ncommand = '  '\n"}, loc(4), "[setup] command is empty"),
    # durations
    ("timeout-words", {"job.toml": RUN + "timeout = '5 parsecs'\n"}, loc(3, 11), "malformed duration"),
    ("timeout-negative", {"job.toml": RUN + "timeout = -3\n"}, loc(3), "negative"),
    ("grace-unit", {"job.toml": RUN + "grace_period = '1x'\n"}, loc(3), "malformed duration"),
    ("grace-bool", {"job.toml": RUN + "grace_period = true\n"}, loc(3), "duration"),
    ("connect-timeout-empty", {"job.toml": RUN + "[ssh]\nconnect_timeout = ''\n"}, loc(4), "duration"),
    # TOML syntax
    ("toml-header", {"job.toml": "[run\ncommand = 'true'\n"}, loc(1), ""),
    ("toml-unterminated", {"job.toml": "[run]\ncommand = \"true\n"}, loc(2), ""),
    ("toml-duplicate-key", {"job.toml": RUN + "command = 'false'\n"}, loc(3), ""),
    ("toml-bare-value", {"job.toml": "[run]\ncommand = true false\n"}, loc(2), ""),
    ("toml-not-utf8", {"job.toml": b"[run]\ncommand = '\xff\xfe'\n"}, loc(2), ""),
    # env
    ("env-reserved-rank", {"job.toml": RUN + "[run.env]\nRANK = '1'\n"}, loc(4, 1), "RANK"),
    ("env-reserved-token", {"job.toml": RUN + "[run.env]\nMLTRAIN_TOKEN = 'x'\n"}, loc(4, 1), "MLTRAIN_TOKEN"),
    ("env-reserved-master", {"job.toml": RUN + "[run.env]\nMASTER_ADDR = 'h'\n"}, loc(4, 1), "MASTER_ADDR"),
    ("env-name-digit", {"job.toml": RUN + "[run.env]\n\"1BAD\" = 'x'\n"}, loc(4, 1), "not a valid"),
    ("env-name-dash", {"job.toml": RUN + "[run.env]\nMY-VAR = 'x'\n"}, loc(4, 1), "not a valid"),
    ("env-name-equals", {"job.toml": RUN + "[run.env]\n\"A=B\" = 'x'\n"}, loc(4, 1), "not a valid"),
    # argv / command
    ("argv-empty", {"job.toml": "[run]\nargv = []\n"}, loc(2), "empty"),
    # profiles
    ("unknown-profile", {"job.toml": "profile = 'locl'\n" + RUN}, loc(1, 11), "unknown profile 'locl'"),
    ("profile-path-missing", {"job.toml": "profile = './nope.toml'\n" + RUN}, loc(1), "profile"),
    ("profile-names-profile", {"job.toml": "profile = './p.toml'\n" + RUN,
                               "p.toml": "profile = 'local'\n"}, r"(\S*/)?p\.toml:1:\d+",
     "cannot name another profile"),
    ("profile-unknown-key", {"job.toml": "profile = './p.toml'\n" + RUN,
                             "p.toml": "[run]\ngrace = '1s'\n"}, r"(\S*/)?p\.toml:2:1",
     "did you mean 'grace_period'"),
    # hostfiles: the hostfile's own file:line
    ("host-duplicate", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "a slots=2\na:2\n"}, hloc(2, 1),
     "duplicate host 'a'"),
    ("host-duplicate-case", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "gpu1\n# c\nGPU1\n"}, hloc(3, 1),
     "duplicate host"),
    ("host-unknown-key", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "gpu1 slot=4\n"}, hloc(1, 6),
     "did you mean 'slots'"),
    ("host-bad-slots", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "ok\ngpu1 slots=x\n"}, hloc(2),
     "bad slot count"),
    ("host-zero-slots", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "gpu1:0\n"}, hloc(1), "bad slot count"),
    ("host-ipv6-bare", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "fe80::1 slots=2\n"}, hloc(1, 1),
     "without brackets"),
    ("host-two-on-line", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "gpu1 gpu2\n"}, hloc(1, 6),
     "one host per line"),
    ("host-range-backwards", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "gpu[2-1]\n"}, hloc(1), "backwards"),
    ("host-max-slots", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "g slots=4 max_slots=2\n"}, hloc(1),
     "max_slots"),
    ("host-dash", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "-oProxyCommand=x\n"}, hloc(1), ""),
    ("host-key-twice", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "h:4 slots=4\n"}, hloc(1), ""),
    ("host-control-char", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "ho\x01st\n"}, hloc(1), r"\\x01"),
    ("hostfile-missing", {"job.toml": BAD_HOSTFILE_SPEC}, r"(\S*/)?hosts\.txt", "cannot read hostfile"),
    # host lists and filters written in the spec: the spec's file:line
    ("hosts-list-bad", {"job.toml": RUN + "[cluster]\nhosts = ['a:2', 'b:0']\n"}, loc(4), "bad slot count"),
    ("include-unknown-host", {"job.toml": FILTER_SPEC + "include = 'c'\n"}, loc(5), "unknown host 'c'"),
    ("include-unknown-slot", {"job.toml": FILTER_SPEC + "include = 'a:5'\n"}, loc(5), "no slot 5"),
    ("exclude-host-twice", {"job.toml": FILTER_SPEC + "exclude = 'a:0@a:1'\n"}, loc(5), ""),
    ("exclude-empty-item", {"job.toml": FILTER_SPEC + "exclude = 'a@'\n"}, loc(5), ""),
    ("include-and-exclude", {"job.toml": FILTER_SPEC + "include = 'a'\nexclude = 'b'\n"}, loc(5),
     "include and exclude"),
    # [ps] and hostfile roles
    ("ps-unknown-key", {"job.toml": RUN + "[ps]\nsynk = false\n"}, loc(4, 1), "did you mean 'sync'"),
    ("ps-optimizer-unknown-key", {"job.toml": RUN + "[ps]\nsync = false\n[ps.optimizer]\nmomentun = 0.5\n"},
     loc(6, 1), "did you mean 'momentum'"),
    ("ps-optimizer-with-sync", {"job.toml": RUN + "[ps]\nsync = true\n[ps.optimizer]\nlr = 0.1\n"}, loc(5, 1),
     "[ps.optimizer] is for asynchronous training, but [ps] sync is true"),
    ("ps-optimizer-default-sync", {"job.toml": RUN + "[ps]\n[ps.optimizer]\nlr = 0.1\n"}, loc(4, 1),
     "sync is true (the default)"),
    ("ps-partition-zero", {"job.toml": RUN + "[ps]\npartition_bytes = 0\n"}, loc(4, 19), "out of range"),
    ("ps-partition-huge", {"job.toml": RUN + "[ps]\npartition_bytes = '2G'\n"}, loc(4, 19), "out of range"),
    ("ps-partition-words", {"job.toml": RUN + "[ps]\npartition_bytes = '4 megs'\n"}, loc(4, 19), "not a size"),
    ("ps-servers-per-host-zero", {"job.toml": RUN + "[ps]\nservers_per_host = 0\n"}, loc(4, 20),
     "out of range"),
    ("ps-mode-conflict", {"job.toml": RUN + "[comm]\nmode = 'allreduce'\n[ps]\n"}, loc(4, 8),
     "contradicts the [ps] table"),
    ("ps-hosts-empty", {"job.toml": RUN + "[ps]\nhosts = []\n"}, loc(4), "[ps] hosts is empty"),
    ("ps-hosts-bad-item", {"job.toml": RUN + "[ps]\nhosts = ['a', 'b:0']\n"}, loc(4), "bad slot count"),
    ("ps-optimizer-name", {"job.toml": RUN + "[ps]\nsync = false\n[ps.optimizer]\nname = 'adam'\n"}, loc(6),
     "not one of: sgd"),
    ("ps-momentum-one", {"job.toml": RUN + "[ps]\nsync = false\n[ps.optimizer]\nmomentum = 1.0\n"}, loc(6),
     "out of range"),
    ("ps-both-counts", {"job.toml": RUN + "[comm]\nnum_servers = 3\n[ps]\nservers_per_host = 2\n"}, loc(6),
     "cannot both be set"),
    ("env-reserved-ps", {"job.toml": RUN + "[run.env]\nMLTRAIN_PS_SYNC = '0'\n"}, loc(4, 1), "MLTRAIN_PS_SYNC"),
    ("host-bad-role", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "a\nb role=servr\n"}, hloc(2, 8),
     "did you mean 'server'"),
    ("host-role-key-typo", {"job.toml": BAD_HOSTFILE_SPEC, "hosts.txt": "b rol=server\n"}, hloc(1, 3),
     "did you mean 'role'"),
    # checks after loading
    ("command-empty", {"job.toml": "[run]\ncommand = ''\n"}, loc(2), "empty"),
    ("nothing-to-run", {"job.toml": "name = 'x'\n"}, r"job\.toml(:\d+:\d+)?", "nothing to run"),
    ("name-with-space", {"job.toml": "name = 'my job'\n" + RUN}, loc(1), "name 'my job'"),
    ("gpus-both", {"job.toml": RUN + "[gpus]\nper_proc = 1\nprocs_per_gpu = 2\n"}, loc(4), "cannot both"),
]

KNOWN_BUGS = {}  # case id -> reason, for strict xfails


def _params():
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[case[0]])] if case[0] in KNOWN_BUGS else []
        yield pytest.param(*case[1:], id=case[0], marks=marks)


def check_error(r, elapsed, where_re, text, sep=": "):
    assert r.returncode >= 0, f"killed by signal {-r.returncode}: {r.stderr}"
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert elapsed < 5, elapsed
    for bad in ("Traceback", "terminate called", "Assertion", "Segmentation", "what():"):
        assert bad not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("mltrain: error:")]
    assert len(errors) == 1, r.stderr
    other = [ln for ln in r.stderr.splitlines() if not ln.startswith(("mltrain: error:", "mltrain: hint:"))]
    assert not other, f"unexpected stderr lines: {other}"
    msg = errors[0][len("mltrain: error: "):]
    assert re.match(where_re + sep, msg), f"location {where_re!r} not at the start of: {msg}"
    if text:
        assert re.search(text if text.startswith("\\") else re.escape(text), msg), msg
    assert len(msg) < 400


def _write(ml, files):
    for name, content in files.items():
        p = ml.dir / name
        (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)


@pytest.mark.parametrize("verb", ["validate", "run"])
@pytest.mark.parametrize("files,where_re,text", list(_params()))
def test_spec_error(ml, verb, files, where_re, text):
    _write(ml, files)
    t0 = time.monotonic()
    r = ml(verb, "job.toml", timeout=15)
    check_error(r, time.monotonic() - t0, where_re, text)
    assert not ml.run_dirs(), "a bad spec created a run folder"


# Flags have no file: their location is the flag's name (and a column within a host list).
CLI_CASES = [
    ("hostfile-flag", ["--hostfile", "hosts.txt"], {"hosts.txt": "a\nb slots=-1\n"}, hloc(2), "slot"),
    ("hosts-flag", ["-H", "a:2,b:0"], {}, r"-H: column 7", "bad slot count"),
    ("include-flag", ["-H", "a:2,b:2", "--include", "c"], {}, r"--include: column 1", "unknown host"),
    ("include-exclude-flags", ["-H", "a,b", "--include", "a", "--exclude", "b"], {},
     r"(--include|command line)", "include and exclude"),
    ("timeout-flag", ["--timeout", "soon"], {}, r"--timeout", ""),
    ("grace-flag", ["--grace-period", "-1s"], {}, r"--grace-period", ""),
    ("env-flag", ["--env", "NOEQUALS"], {}, r"--env", "K=V"),
    ("profile-flag", ["--profile", "nosuch"], {}, r"--profile", "profile"),
    ("ranks-flag", ["--ranks", "x-1"], {}, r"--ranks", ""),
]


def _flag_params():
    for c in CLI_CASES:
        for verb in ("validate", "run"):
            if verb == "validate" and c[0] == "ranks-flag":
                continue  # a console flag: validate does not take it (test_cli_edges.py checks --help)
            yield pytest.param(verb, *c[1:], id=f"{c[0]}-{verb}")


@pytest.mark.parametrize("verb,args,files,where_re,text", list(_flag_params()))
def test_flag_error(ml, verb, args, files, where_re, text):
    _write(ml, files)
    ml.write("job.toml", RUN)
    argv = ["job.toml", *args] if verb == "validate" else [*args, "-n", "1", "--", "true"]
    t0 = time.monotonic()
    r = ml(verb, *argv, timeout=15)
    check_error(r, time.monotonic() - t0, where_re, text, sep="[: ]")
    assert not ml.run_dirs()


def test_validate_adhoc_command(ml):
    r = ml("validate", "-n", "2", "--", "true")
    assert r.returncode == 0, r.stderr


def test_missing_spec_file(ml):
    r = ml("validate", "nope.toml")
    assert r.returncode == 2
    assert r.stderr.startswith("mltrain: error: nope.toml: cannot read job spec")


def test_no_command_and_no_spec(ml):
    r = ml("run")
    assert r.returncode == 2 and "mltrain: error:" in r.stderr


def test_good_spec_validates(ml):
    ml.write("hosts.txt", "# comment\nlocalhost slots=2\n")
    ml.write("job.toml", "profile = 'local'\n" + RUN + "[cluster]\nhostfile = 'hosts.txt'\n")
    r = ml("validate", "job.toml")
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


# --- command-line parse errors ------------------------------------------------------------------

CLI_PARSE = [
    ("unknown-verb", ["rnu"]),
    ("unknown-flag", ["run", "--bogus", "--", "true"]),
    ("nprocs-zero", ["run", "-n", "0", "--", "true"]),
    ("nprocs-word", ["run", "-n", "four", "--", "true"]),
    ("missing-dashdash", ["run", "-n", "2", "sh", "-c", "true"]),
    ("no-verb", []),
]


@pytest.mark.parametrize("args", [pytest.param(a, id=i) for i, a in CLI_PARSE])
def test_cli_parse_error_exit_2(ml, args):
    t0 = time.monotonic()
    r = ml(*args, timeout=10)
    assert r.returncode == 2, r
    assert time.monotonic() - t0 < 5
    assert r.stderr.strip() and not r.stdout.strip().startswith("{")
    assert not ml.run_dirs()


@pytest.mark.parametrize("args,hint", [(["rnu"], "run"), (["run", "--nproc", "2", "--", "true"], "--nprocs")],
                         ids=["verb-typo", "flag-typo"])
def test_cli_parse_error_format(ml, args, hint):
    r = ml(*args, timeout=10)
    assert r.stderr.startswith("mltrain: error:"), r.stderr
    assert hint in r.stderr


def test_a_bad_env_or_job_name_is_quoted_on_one_line(ml):
    # A name holding a newline (or ESC) was printed raw, breaking the message over lines.
    for args, says in ((["run", "-e", "A\nB=1", "--", "true"], "'A\\x0aB' is not a valid environment variable name"),
                       (["run", "--name", "x\x1b[2Jy", "--", "true"], "name 'x\\x1b[2Jy' may hold only")):
        r = ml(*args)
        assert r.returncode == 2 and says in r.stderr, r.stderr
        assert "\x1b" not in r.stderr and r.stderr.splitlines()[0].startswith("mltrain: error:"), r.stderr
        assert len(r.stderr.splitlines()) == 2, r.stderr


# Every unknown key of a spec at once, in file order (not one per run, not [cluster] before [run]).
TYPOS = """\
name = "typos"
[run]
comand = "echo hi"
max_restart = 2
[cluster]
hsts = ["localhost"]
[gpus]
per_prc = 1
"""


@pytest.mark.parametrize("sub", ["validate", "run"])
def test_every_unknown_key_at_once_in_file_order(ml, sub):
    ml.write("job.toml", TYPOS)
    r = ml(sub, "job.toml")
    assert r.returncode == 2, r.stderr
    err = r.stderr
    wanted = ["job.toml:3:1: unknown key 'comand' in [run] (did you mean 'command'?)",
              "job.toml:4:1: unknown key 'max_restart' in [run] (did you mean 'max_restarts'?)",
              "job.toml:6:1: unknown key 'hsts' in [cluster] (did you mean 'hosts'?)",
              "job.toml:8:1: unknown key 'per_prc' in [gpus] (did you mean 'per_proc'?)"]
    at = [err.find(w) for w in wanted]
    assert all(a >= 0 for a in at), err
    assert at == sorted(at), err
    assert "4 problems" in err and "hint: see docs/spec.md" in err, err


def test_one_typo_is_still_one_line(ml):
    ml.write("job.toml", '[run]\ncommand = "true"\ntimeot = "1m"\n')
    r = ml("validate", "job.toml")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0].endswith("job.toml:3:1: unknown key 'timeot' in [run] (did you mean 'timeout'?)")


def test_a_typo_and_a_wrong_value_together(ml):
    ml.write("job.toml", '[run]\ncommand = "true"\ncomand = "x"\n[cluster]\nnprocs = "two"\n')
    r = ml("validate", "job.toml")
    assert r.returncode == 2
    assert "2 problems" in r.stderr, r.stderr
    assert r.stderr.find("'comand'") < r.stderr.find("'nprocs' must be an integer"), r.stderr
