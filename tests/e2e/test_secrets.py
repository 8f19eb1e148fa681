"""Secrets stay out of records and printouts (issue 9, item 1).

A value given by `--env`, by a `forward_env` match or by `[run.env]`, under a name that looks
secret (or one listed in MLTRAIN_SECRET_VARS), reaches the ranks but appears in no file under the
state folder and in nothing mltrain prints. Records are private: folders 0700, files 0600.
"""
import json
import os
import stat
import uuid

from conftest import wait_for


def _secret(tag):
    return f"s3cr3t-{tag}-{uuid.uuid4().hex}"


def _all_files(root):
    for dirpath, _, files in os.walk(root):
        for f in files:
            yield os.path.join(dirpath, f)


def test_secret_values_reach_ranks_but_no_record_or_printout(ml, tmp_path):
    secrets = {
        "WANDB_API_KEY": _secret("cli"),          # --env
        "MY_SERVICE_TOKEN": _secret("forward"),   # forward_env glob match
        "DB_PASSWORD": _secret("spec"),           # [run.env]
        "HF_LOGIN": _secret("listed"),            # [run.env], named in MLTRAIN_SECRET_VARS
    }
    outside = tmp_path / "rank-out"
    outside.mkdir()
    # The rank proves it got every value by writing it outside the state folder, not to stdout.
    names = " ".join(f"${k}" for k in secrets)
    ml.write("job.toml", f"""
name = "sec"
[run]
command = 'printf "%s\\\\n" {names} > {outside}/got-$RANK; echo "rank $RANK ok"; exit ${{FAIL:-0}}'
forward_env = ["MY_SERVICE_*"]
[run.env]
DB_PASSWORD = "{secrets['DB_PASSWORD']}"
HF_LOGIN = "{secrets['HF_LOGIN']}"
PLAIN_VALUE = "visible-{uuid.uuid4().hex}"
""")
    env = {"MY_SERVICE_TOKEN": secrets["MY_SERVICE_TOKEN"], "MLTRAIN_SECRET_VARS": "hf_*, OTHER"}
    cli = ["--env", f"WANDB_API_KEY={secrets['WANDB_API_KEY']}"]
    outputs = []

    def run(*args, **kw):
        r = ml(*args, env=env, **kw)
        outputs.append((args, r.stdout + r.stderr))
        return r

    ok = run("run", "job.toml", "-n", "2", *cli)
    assert ok.returncode == 0, ok.stderr
    for rank in range(2):
        got = (outside / f"got-{rank}").read_text().split()
        assert got == list(secrets.values()), got
    failing = run("run", "job.toml", "-n", "2", *cli, "--env", "FAIL=3")
    assert failing.returncode != 0
    json_run = run("run", "--json", "job.toml", "-n", "1", *cli)
    assert json_run.returncode == 0, json_run.stderr
    detached = run("run", "-d", "job.toml", "-n", "1", *cli)
    assert detached.returncode == 0, detached.stderr
    run_id = detached.stdout.strip()
    wait_for(lambda: json.loads(ml("show", "--json", run_id).stdout)["status"] != "running", 15,
             "the detached run to end")
    dry = run("run", "--dry-run", "job.toml", *cli)
    assert dry.returncode == 0, dry.stderr
    assert "WANDB_API_KEY=<secret>" in dry.stdout and "DB_PASSWORD=<secret>" in dry.stdout
    assert "HF_LOGIN=<secret>" in dry.stdout and "PLAIN_VALUE=visible-" in dry.stdout
    dry_json = run("run", "--dry-run", "--json", "job.toml", *cli)
    assert dry_json.returncode == 0, dry_json.stderr
    rank_env = json.loads(dry_json.stdout)["ranks"][0]["env"]
    assert rank_env["MY_SERVICE_TOKEN"] == "<secret>" and rank_env["WANDB_API_KEY"] == "<secret>"
    for cmd in (["show"], ["show", "--json"], ["ls"], ["ls", "--json"], ["logs"], ["validate", "job.toml"]):
        r = run(*cmd)
        assert r.returncode == 0, (cmd, r.stderr)
    rec = json.loads(ml("show", "--json", ok_id := ml.run_dirs()[0].name).stdout)
    assert rec["ranks"][0]["env"]["DB_PASSWORD"] == "<secret>", ok_id
    assert "<secret>" in rec["spec_text"]

    for args, text in outputs:
        for name, value in secrets.items():
            assert value not in text, f"{name}'s value printed by mltrain {' '.join(args)}"
    state_roots = [ml.home, tmp_path / "state"]
    seen = 0
    for root in state_roots:
        for path in _all_files(root):
            seen += 1
            data = open(path, "rb").read()
            for name, value in secrets.items():
                assert value.encode() not in data, f"{name}'s value written to {path}"
    assert seen >= 4 * 3  # four runs, each with run.json and rank logs


def test_state_folder_and_records_are_private(ml):
    r = ml("run", "-n", "1", "--", "true")
    assert r.returncode == 0, r.stderr
    r = subprocess_with_umask(ml, 0)
    assert r.returncode == 0, r.stderr
    for d in [ml.home, ml.runs_dir, *ml.run_dirs()]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    files = [p for d in ml.run_dirs() for p in d.iterdir() if p.is_file()]
    assert any(p.name == "run.json" for p in files) and any(p.name.startswith("rank-") for p in files)
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def subprocess_with_umask(ml, mask):
    """Runs one job with a permissive umask: modes must not depend on it."""
    import subprocess
    return subprocess.run(["sh", "-c", f'umask {mask:03o}; exec "$0" "$@"', ml.bin, "run", "-n", "1", "--",
                           "true"], env=ml.env, cwd=str(ml.dir), capture_output=True, text=True, timeout=30)
