"""What a run keeps of its code (docs/sync.md, "The code of a run"): the synced tree's manifest in
the run's folder, the files' contents once in the state folder's store however many runs hold
them, the uncommitted diff of a git tree; never a secret's value; `rm` and `gc` take what no run
names any more."""
import json
import os
import subprocess


def project(ml, extra="", files=None):
    p = ml.dir / "proj"
    p.mkdir()
    (p / "job.toml").write_text(
        f'name = "code"\n[run]\ncommand = "cat train.py"\n[sync]\nremote_dir = "{ml.dir / "remote"}"\n' + extra)
    (p / "train.py").write_text("print('version 1')\n")
    for name, data in (files or {}).items():
        (p / name).parent.mkdir(parents=True, exist_ok=True)
        (p / name).write_bytes(data)
    return p


def store_bytes(ml):
    objects = ml.home / "code" / "objects"
    return sum(f.stat().st_size for f in objects.rglob("*") if f.is_file()) if objects.exists() else 0


def store_files(ml):
    objects = ml.home / "code" / "objects"
    return sorted(f for f in objects.rglob("*") if f.is_file()) if objects.exists() else []


def manifest(run_dir):
    return {e[0]: e for e in json.loads((run_dir / "code.json").read_text())["entries"]}


def kept(ml, run_dir, path):
    """A file's content as the store keeps it for that run."""
    h = manifest(run_dir)[path][4]
    obj = ml.home / "code" / "objects" / h[:2] / h[2:]
    return subprocess.run(["zstd", "-dcq", str(obj)], capture_output=True, check=True).stdout


def run(ml, *args, **kw):
    """Runs `mltrain run ...` and returns (result, the run's folder): the one it added."""
    before = set(ml.run_dirs())
    r = ml("run", *args, **kw)
    added = set(ml.run_dirs()) - before
    assert len(added) == 1, (added, r.stderr)
    return r, added.pop()


def record(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def test_twenty_runs_of_an_unchanged_tree_keep_it_once_and_gc_empties_the_store(ml):
    # 100 MiB that does not compress, in 100 files, beside the program.
    big = {f"data/part{i:03d}.bin": os.urandom(1 << 20) for i in range(100)}
    p = project(ml, files=big)
    r, first = run(ml, p / "job.toml", timeout=120)
    assert r.returncode == 0, r.stderr
    after_one = store_bytes(ml)
    assert after_one >= 100 << 20, after_one
    c = record(first)["code"]
    assert c["kept"] and c["files"] == 102 and c["bytes"] >= 100 << 20 and c["new_bytes"] >= 100 << 20, c
    assert kept(ml, first, "data/part007.bin") == big["data/part007.bin"]
    for _ in range(19):
        r, again = run(ml, p / "job.toml", timeout=120)
        assert r.returncode == 0, r.stderr
        assert record(again)["code"]["new_bytes"] == 0
    assert len(ml.run_dirs()) == 20
    grown = store_bytes(ml) - after_one
    assert grown < 1 << 20, grown
    # Each run's own manifest is small beside it, too.
    assert sum((d / "code.json").stat().st_size for d in ml.run_dirs()) < 1 << 20
    show = ml("show", first.name)
    assert "code       102 files, 100.0 MiB, kept (100.0 MiB new in the store)" in show.stdout, show.stdout
    r = ml("gc", "--keep", "0")
    assert r.returncode == 0 and "removed 20 runs" in r.stdout and "removed the code no run keeps" in r.stdout, r.stdout
    assert store_files(ml) == [], store_files(ml)


def test_each_run_keeps_the_tree_it_ran_and_rm_takes_only_what_no_run_names(ml):
    p = project(ml, files={"util.py": b"HELPER = 1\n"})
    r, a = run(ml, p / "job.toml", timeout=60)
    assert r.returncode == 0, r.stderr
    (p / "train.py").write_text("print('version 2')\n")
    (p / "util.py").unlink()
    r, b = run(ml, p / "job.toml", timeout=60)
    assert r.returncode == 0 and "version 2" in r.stdout, r.stderr
    assert "util.py" in manifest(a) and "util.py" not in manifest(b)
    assert kept(ml, a, "train.py") == b"print('version 1')\n"
    assert kept(ml, b, "train.py") == b"print('version 2')\n"
    assert kept(ml, a, "util.py") == b"HELPER = 1\n"
    # A's own contents go with A; what B names stays.
    r = ml("rm", a.name)
    assert r.returncode == 0 and "removed the code no run keeps" in r.stdout, r.stdout
    assert kept(ml, b, "train.py") == b"print('version 2')\n" and kept(ml, b, "job.toml")
    assert len(store_files(ml)) == 2, store_files(ml)  # B's job.toml and train.py


def test_no_secret_value_reaches_the_store_the_record_or_the_diff(ml):
    secret = "tok-" + os.urandom(12).hex()
    p = project(ml, extra=f'[run.env]\nAPI_TOKEN = "{secret}"\n', files={"notes.txt": b"nothing here\n"})
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    git = lambda *a: subprocess.run(["git", "-C", str(p), *a], check=True, capture_output=True,
                                    env={**os.environ, **env})
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first")
    (p / "notes.txt").write_text(f"nothing here\nexport KEY={secret}\n")  # uncommitted, with the value
    r, one = run(ml, p / "job.toml", env={"OTHER_SECRET": "laptop-" + secret[:10]}, timeout=60)
    assert r.returncode == 0, r.stderr
    c = record(one)["code"]
    assert c["kept"] and c["dirty"] and c["withheld"] == 2, c  # job.toml and notes.txt hold it
    held = {w["path"]: w["why"] for w in json.loads((one / "code.json").read_text())["withheld"]}
    assert held == {"job.toml": "it holds a secret's value", "notes.txt": "it holds a secret's value"}, held
    diff = (one / "code.diff").read_text()
    assert "+export KEY=<secret>" in diff, diff
    show = ml("show", one.name)
    assert "uncommitted changes (code.diff)" in show.stdout and "2 files withheld" in show.stdout, show.stdout
    # Nothing under the state folder holds the value, in the clear or in the store's frames.
    for f in ml.home.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            if f.parent.parent.name == "objects":
                data = subprocess.run(["zstd", "-dcq", str(f)], capture_output=True, check=True).stdout
            assert secret.encode() not in data, f
    assert kept(ml, one, "train.py") == b"print('version 1')\n"
    # Nor does anything that reads the records back: show, diff, the exports.
    for args in (["show", one.name], ["show", "--json", one.name], ["diff", one.name, one.name],
                 ["diff", "--json", one.name, one.name], ["ls", "--json"], ["ls", "--jsonl"],
                 ["ls", "--jsonl", "--columns", "id,name,spec,env.python"], ["logs", one.name]):
        out = ml(*args)
        assert out.returncode == 0 and secret not in out.stdout + out.stderr, args


def test_record_code_false_keeps_nothing_and_code_max_keeps_the_manifest_only(ml):
    p = project(ml, extra="[record]\ncode = false\n")
    r, one = run(ml, p / "job.toml", timeout=60)
    assert r.returncode == 0, r.stderr
    assert not (one / "code.json").exists() and record(one)["code"] is None
    assert "code = false" in record(one)["spec_text"]
    assert "\ncode " not in ml("show", one.name).stdout
    (p / "job.toml").write_text((p / "job.toml").read_text().replace("code = false", 'code_max = "10"'))
    r, one = run(ml, p / "job.toml", timeout=60)
    assert r.returncode == 0, r.stderr
    c = record(one)["code"]
    assert not c["kept"] and "over [record] code_max" in c["skipped"], c
    assert set(manifest(one)) == {"job.toml", "train.py"}
    assert store_files(ml) == []
    assert "contents not kept: the tree is" in ml("show", one.name).stdout


def test_a_local_run_without_sync_keeps_its_workdir_never_the_state_folder_nor_a_home_s_worth(ml):
    w = ml.dir / "work"
    (w / "pkg").mkdir(parents=True)
    (w / "pkg" / "model.py").write_text("LAYERS = 4\n")
    (w / "run.sh").write_text("cat pkg/model.py\n")
    r, one = run(ml, "-n", "2", "--workdir", w, "--", "sh", "run.sh", timeout=60)
    assert r.returncode == 0 and r.stdout.count("LAYERS = 4") == 2, r.stderr
    assert set(manifest(one)) == {"pkg", "pkg/model.py", "run.sh"}
    assert kept(ml, one, "pkg/model.py") == b"LAYERS = 4\n"
    # From a folder that holds the state folder: everything but the state folder.
    r, two = run(ml, "-n", "1", "--", "true", timeout=60)
    assert r.returncode == 0, r.stderr
    paths = set(manifest(two))
    assert "work/pkg/model.py" in paths and not any(p == "home" or p.startswith("home/") for p in paths), paths
    # A workdir over [record] code_max is not listed at all, and show says why.
    (w / "big.bin").write_bytes(os.urandom(3 << 20))
    ml.write("small.toml", f'[run]\ncommand = "true"\nworkdir = "{w}"\n[record]\ncode_max = "2M"\n')
    r, three = run(ml, ml.dir / "small.toml", timeout=60)
    assert r.returncode == 0, r.stderr
    assert not (three / "code.json").exists()
    c = record(three)["code"]
    assert not c["kept"] and "is not a project's size: its files hold more than 2 MiB" in c["skipped"], c
    assert "code       not kept: the workdir" in ml("show", three.name).stdout
