"""Finding and exporting runs (`ls --where/--columns/--jsonl`) and what a record keeps of each
host's environment (docs/records.md, "Environment", "Find and export")."""
import json
import os
import subprocess

TRAIN = """
import sys, mltrain
scale = float(sys.argv[1])
for step in range(20):
    mltrain.log(step=step, loss=scale / (step + 1))
sys.exit(int(sys.argv[2]))
"""


def runs(ml, *cases):
    """Runs the trainer once per (name, scale, exit code); their ids in that order."""
    (ml.dir / "train.py").write_text(TRAIN)
    ids = []
    for name, scale, code in cases:
        before = set(ml.run_dirs())
        r = ml("run", "--name", name, "--", "/usr/bin/python3", ml.dir / "train.py", str(scale), str(code),
               timeout=60)
        assert r.returncode == code, r.stderr
        (new,) = set(ml.run_dirs()) - before
        ids.append(new.name)
    return ids


def test_where_columns_and_jsonl_find_and_export_runs_by_their_metrics(ml):
    good, bad, broken = runs(ml, ("good", 1.0, 0), ("bad", 40.0, 0), ("broken", 2.0, 3))
    r = ml("ls", "--where", "metric.loss < 0.08", "--columns", "id,name,metric.loss,metric.loss.count,status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "METRIC.LOSS", "METRIC.LOSS.COUNT", "STATUS"]
    assert [l.split() for l in lines[1:]] == [[good, "good", "0.05", "20", "succeeded"]], r.stdout

    r = ml("ls", "--where", "status = failed or metric.loss.first >= 40", "--columns", "name,exit")
    assert r.stdout.splitlines()[1:] == ["broken  3", "bad     0"], r.stdout  # newest first
    r = ml("ls", "--where", "name ~ ^b and exit != 3", "--columns", "name")
    assert r.stdout.splitlines()[1:] == ["bad"], r.stdout

    rows = [json.loads(l) for l in ml("ls", "--jsonl").stdout.splitlines()]
    assert [row["id"] for row in rows] == [broken, bad, good]
    assert rows[1]["metrics_last"] == {"loss": 2.0} and rows[0]["status"] == "failed"
    assert rows[2]["hosts"][0]["environment"]["python"].startswith("3.")
    flat = [json.loads(l) for l in ml("ls", "--jsonl", "--where", "exit = 0", "--columns", "name,metric.loss,git")
            .stdout.splitlines()]
    assert flat == [{"name": "bad", "metric.loss": 2.0, "git": None}, {"name": "good", "metric.loss": 0.05, "git": None}]
    doc = json.loads(ml("ls", "--json", "--where", "name = good").stdout)
    assert [run["id"] for run in doc["runs"]] == [good]
    # `spec` is the spec file (none for a command line), `spec_text` the TOML the run resolved: one
    # name, one meaning, in --where, --columns and --jsonl alike (issue 47 item 16).
    r = ml("ls", "--where", "spec_text ~ 40\\.0", "--columns", "name,spec")
    assert [l.split() for l in r.stdout.splitlines()[1:]] == [["bad", "-"]], r.stdout
    assert all("40.0" in row["spec_text"] or row["id"] != bad for row in rows) and "spec" not in rows[0]

    r = ml("ls", "--where", "metric.loss < 0")
    assert r.returncode == 0 and "no run of the 3 recorded matches --where 'metric.loss < 0'" in r.stdout


def test_a_filter_or_column_that_does_not_read_is_a_usage_error_naming_the_fields(ml):
    runs(ml, ("one", 1.0, 0))
    for args, said in ((["--where", "loss < 3"], "unknown field 'loss'"),
                       (["--where", "metric.loss <"], "'metric.loss <' is not a condition FIELD OP VALUE"),
                       (["--where", "name ~ ("], "is not a regular expression"),
                       (["--columns", "id,durration"], "unknown field 'durration'"),
                       (["--json", "--jsonl"], "--json and --jsonl do not go together")):
        r = ml("ls", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert said in r.stderr, (args, r.stderr)
        if "field" in said:
            assert "metric.NAME" in r.stderr and "env.KEY" in r.stderr


def test_each_host_environment_is_recorded_shown_and_cached(ml, tmp_path):
    home = tmp_path / "user-home"
    home.mkdir()
    pydir = tmp_path / "pylib"
    pydir.mkdir()
    env = {"HOME": str(home), "PYTHONPATH": str(pydir)}
    (ml.dir / "train.py").write_text(TRAIN)

    def run_once():
        before = set(ml.run_dirs())
        r = ml("run", "--", "/usr/bin/python3", ml.dir / "train.py", "1", "0", env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        (new,) = set(ml.run_dirs()) - before
        return new, json.loads((new / "run.json").read_text())["hosts"][0]["environment"]

    run, facts = run_once()
    # What its installed metadata says (torch.__version__ may be shorter: Debian's says 1.13.0a0).
    torch = subprocess.run(["/usr/bin/python3", "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                           capture_output=True, text=True).stdout.strip()
    assert facts["python"].startswith("3.") and facts["python"].endswith("(/usr/bin/python3)"), facts
    assert facts["torch"] == (torch or "-"), facts
    assert facts["kernel"] == os.uname().release and facts["arch"] == os.uname().machine
    assert facts["os"] and facts["glibc"] and facts["mltrain"].startswith("0.")
    show = ml("show", run.name).stdout
    assert "\nenvironment\n" in show and f"  kernel      {os.uname().release}\n" in show, show
    assert f"  torch       {facts['torch']}\n" in show

    # The interpreter's versions come from the cache while nothing on its sys.path changed ...
    (cache,) = (home / ".cache" / "mltrain" / "python-facts").iterdir()
    text = cache.read_text()
    assert f"dir " in text and str(pydir) in text
    cache.write_text(text.replace(f"torch {facts['torch']}\n", "torch 0.0-from-cache\n"))
    assert run_once()[1]["torch"] == "0.0-from-cache"
    # ... and from the interpreter again once a folder on it changed (a pip install).
    (pydir / "new_package.py").write_text("")
    os.utime(pydir, (1, 1))
    assert run_once()[1]["torch"] == facts["torch"]


def test_diff_compares_the_environment_and_utilization(ml):
    a, b = runs(ml, ("a", 1.0, 0), ("b", 1.0, 0))
    d = json.loads(ml("diff", a, b, "--json").stdout)
    assert d["fields"]["kernel"] == {"a": os.uname().release, "b": os.uname().release, "same": True}
    assert d["fields"]["python"]["same"] and "cpu use" in d["fields"] and "gpu use" in d["fields"]
    assert d["fields"]["gpu use"]["a"] == "-"  # no GPU here


def test_a_huge_or_deep_pattern_is_a_clear_error_not_a_crash(ml):
    # std::regex overflowed its stack on these (SIGSEGV); RE2 with bounds says what is wrong.
    assert ml("run", "--", "true").returncode == 0
    huge = "a" * 100_000
    r = ml("ls", "--where", f"name ~ {huge}")
    assert r.returncode == 2 and "at most 4096 are taken" in r.stderr, r.stderr[-500:]
    deep = "(" * 200 + "a" + ")" * 200
    r = ml("logs", "--grep", deep, "latest")
    assert r.returncode == 2 and "nests groups more than 64 deep" in r.stderr, r.stderr[-500:]
    spec = ml.write("m.toml", f"[run]\ncommand = \"true\"\n[metrics]\npattern = '(?P<loss>{huge})'\n")
    for args in (["validate", spec], ["run", "--dry-run", spec]):
        r = ml(*args)
        assert r.returncode == 2 and "m.toml:4:" in r.stderr and "at most 4096 are taken" in r.stderr, r.stderr[-500:]


def test_a_misspelt_metric_or_run_says_what_is_there_and_ls_n_keeps_the_newest(ml):
    logger = ml.write("log.py", "import mltrain\nmltrain.log(step=0, loss=0.5)\n")
    for _ in range(3):
        assert ml("run", "--", "/usr/bin/python3", logger).returncode == 0
    # "no run matches" was all it said of a metric no run has.
    r = ml("ls", "--where", "metric.los < 1")
    assert r.returncode == 2 and "no run has a metric 'los' (did you mean 'loss'?)" in r.stderr, r.stderr
    assert ml("ls", "--where", "metric.loss.min < 1", "--columns", "id").stdout.count("\n") == 4
    r = ml("show", "lastest")
    assert r.returncode != 0 and "(did you mean 'latest'?)" in r.stderr, r.stderr
    every = ml("ls", "--columns", "id").stdout.split()[1:]
    r = ml("ls", "-n", "2", "--columns", "id")
    assert r.returncode == 0 and len(every) == 3 and r.stdout.split()[1:] == every[:2], r.stdout
