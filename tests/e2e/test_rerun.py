"""`mltrain rerun RUN` (docs/records.md, "Rerun"): the code the run synced, restored from the code
store whatever became of the project, its spec and hosts, secrets from this shell again."""
import hashlib
import json
import shutil


def project(ml, extra=""):
    p = ml.dir / "proj"
    p.mkdir()
    (p / "job.toml").write_text(
        'name = "again"\n[run]\ncommand = "cat train.py; cat data/util.txt 2>/dev/null || echo no-util"\n'
        f'[cluster]\nnprocs = 2\n[sync]\nremote_dir = "{ml.dir / "remote"}"\n' + extra)
    (p / "train.py").write_text("print('version 1')\n")
    (p / "data").mkdir()
    (p / "data" / "util.txt").write_text("util here\n")
    return p


def added_run(ml, before):
    added = set(ml.run_dirs()) - before
    assert len(added) == 1, added
    return added.pop()


def test_rerun_runs_the_code_a_run_ran_after_the_project_changed_and_after_it_is_gone(ml):
    p = project(ml)
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 0, r.stderr
    a = ml.run_dirs()[-1].name
    (p / "train.py").write_text("print('version 2')\n")
    (p / "data" / "util.txt").unlink()
    before = set(ml.run_dirs())
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 0 and r.stdout.count("version 2") == 2 and r.stdout.count("no-util") == 2, r.stdout
    b = added_run(ml, before).name

    before = set(ml.run_dirs())
    r = ml("rerun", a, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("version 1") == 2 and r.stdout.count("util here") == 2, r.stdout  # every rank
    again = json.loads((added_run(ml, before) / "run.json").read_text())
    assert again["rerun_of"] == a and again["status"] == "succeeded" and again["code"]["new_bytes"] == 0, again
    assert f"rerun of   {a}" in ml("show", again["id"]).stdout

    shutil.rmtree(p)
    for run, version, util in ((a, "version 1", "util here"), (b, "version 2", "no-util")):
        r = ml("rerun", run, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.count(version) == 2 and r.stdout.count(util) == 2, r.stdout

    # Removing the run removes what rerun restored of it; a rerun of a run that is gone says so.
    assert (ml.home / "reruns" / a).is_dir()
    assert ml("rm", a).returncode == 0 and not (ml.home / "reruns" / a).exists()
    r = ml("rerun", a)
    assert r.returncode == 2 and f"no run matches '{a}'" in r.stderr, r.stderr


def test_a_secret_is_taken_from_the_shell_again_never_from_the_record(ml):
    secret = "tok-0123456789abcdef"
    p = project(ml, f'[run.env]\nAPI_TOKEN = "{secret}"\n')
    text = (p / "job.toml").read_text().replace('command = "cat train.py; cat data/util.txt 2>/dev/null || echo no-util"',
                                                "command = 'printf %s \"$API_TOKEN\" | md5sum'")
    (p / "job.toml").write_text(text)
    want = hashlib.md5(secret.encode()).hexdigest()
    r = ml("run", p / "job.toml", timeout=60)
    assert r.returncode == 0 and r.stdout.count(want) == 2, r.stdout
    a = ml.run_dirs()[-1].name
    r = ml("rerun", a, unset=("API_TOKEN",), timeout=60)
    assert r.returncode == 2, r
    assert "[run.env] API_TOKEN is a secret: its value was never recorded" in r.stderr, r.stderr
    assert "set API_TOKEN in this shell" in r.stderr
    r = ml("rerun", a, env={"API_TOKEN": secret}, timeout=60)
    assert r.returncode == 0 and r.stdout.count(want) == 2, (r.stdout, r.stderr)
    # job.toml held the value, so the store never kept it: the rerun says so and uses the record's spec.
    assert f"run {a} did not keep job.toml (it held a secret's value" in r.stderr, r.stderr
    for f in ml.home.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_rerun_with_flags_and_of_runs_that_kept_no_code(ml):
    p = project(ml)
    assert ml("run", p / "job.toml", timeout=60).returncode == 0
    a = ml.run_dirs()[-1].name
    r = ml("rerun", a, "-n", "3", timeout=60)
    assert r.returncode == 0 and r.stdout.count("version 1") == 3, r.stdout
    r = ml("rerun", a, "--dry-run")
    assert r.returncode == 0 and "sync:" in r.stdout and str(ml.home / "reruns" / a / "tree") in r.stdout, r.stdout

    ml.write("nocode.toml", '[run]\ncommand = "true"\n[record]\ncode = false\n')
    assert ml("run", ml.dir / "nocode.toml").returncode == 0
    r = ml("rerun", "latest")
    assert r.returncode != 0 and "kept no code" in r.stderr and "[sync]" in r.stderr, r.stderr
    r = ml("rerun", a, "--", "echo", "other")
    assert r.returncode == 2 and "takes none after '--'" in r.stderr, r.stderr


def test_diff_shows_what_changed_between_two_runs_record_spec_and_code(ml):
    p = project(ml)
    (p / "logo.bin").write_bytes(b"\x00\x01binary")
    assert ml("run", p / "job.toml", timeout=60).returncode == 0
    a = ml.run_dirs()[-1].name
    (p / "train.py").write_text("print('version 2')\n")
    (p / "data" / "util.txt").unlink()
    (p / "new.py").write_text("NEW = 1\n")
    (p / "logo.bin").write_bytes(b"\x00\x02binary")
    before = set(ml.run_dirs())
    assert ml("run", p / "job.toml", "-n", "3", timeout=60).returncode == 0
    b = added_run(ml, before).name

    r = ml("diff", a, b)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "* ranks      2" in out and out.count(" 3\n") >= 1, out
    assert "  name       again" in out and "=" in out, out  # the same on both sides
    assert "spec: changed" in out and "-nprocs = 2" in out and "+nprocs = 3" in out, out
    assert "code: 2 changed, 1 added, 1 removed" in out, out
    assert "  changed  train.py" in out and "  removed  data/util.txt" in out and "  added    new.py" in out, out
    assert "-print('version 1')\n+print('version 2')" in out, out  # the changed line, unified
    assert "--- a/data/util.txt" in out and "-util here" in out, out  # the deleted file's lines
    assert "Binary or large files a/logo.bin and b/logo.bin differ" in out, out

    doc = json.loads(ml("diff", "--json", a, b).stdout)
    assert doc["schema"] == 1 and doc["a"] == a and doc["b"] == b
    assert doc["fields"]["ranks"] == {"a": "2", "b": "3", "same": False}
    assert doc["code"]["removed"] == ["data/util.txt"] and doc["code"]["added"] == ["new.py"]
    assert sorted(doc["code"]["changed"]) == ["logo.bin", "train.py"] and "+print('version 2')" in doc["code"]["diff"]

    same = ml("diff", a, a).stdout
    assert "spec: the same" in same and "code: the same" in same and "*" not in same, same
    ml.write("nocode.toml", '[run]\ncommand = "true"\n[record]\ncode = false\n')
    assert ml("run", ml.dir / "nocode.toml").returncode == 0
    r = ml("diff", a, "latest")
    assert r.returncode == 0 and "code: not compared: run " in r.stdout and "kept no code" in r.stdout, r.stdout


def test_a_content_changed_in_the_store_is_refused_not_run(ml):
    p = project(ml)
    assert ml("run", p / "job.toml", timeout=60).returncode == 0
    a = ml.run_dirs()[-1].name
    h = {e[0]: e[4] for e in json.loads((ml.runs_dir / a / "code.json").read_text())["entries"]}["train.py"]
    obj = ml.home / "code" / "objects" / h[:2] / h[2:]
    obj.chmod(0o600)
    other = ml.dir / "other.py"
    other.write_text("print('not what ran')\n")
    obj.write_bytes(__import__("subprocess").run(["zstd", "-cq", str(other)], capture_output=True, check=True).stdout)
    r = ml("rerun", a, timeout=60)
    assert r.returncode != 0 and "the code store's copy of train.py does not match its hash" in r.stderr, r.stderr
    assert "not what ran" not in r.stdout
