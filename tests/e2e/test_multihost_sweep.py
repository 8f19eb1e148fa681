"""`mltrain sweep` on the 4 hosts of the test cluster (docs/sweep.md): a 3 x 2 grid of 4-rank
trials, two at a time, ranked by the loss rank 0 logs; the diverging trial stopped early."""
import json
import shutil
from datetime import datetime
from pathlib import Path

from multihost_fixtures import cluster, mh, shared_root  # noqa: F401 (fixtures)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sweep"


def test_a_grid_sweep_on_four_hosts_never_runs_more_than_two_trials(mh, cluster):  # noqa: F811
    d = mh.shared / "sweep"
    d.mkdir()
    shutil.copy(EXAMPLE / "train.py", d / "train.py")
    d.chmod(0o755)
    (d / "train.py").chmod(0o644)
    text = (EXAMPLE / "sweep.toml").read_text().replace("nprocs = 1", 'hosts = ["h1", "h2", "h3", "h4"]')
    text = text.replace('workdir = "."', f'workdir = "{d}"')
    # 4 s a trial: the diverging one must still run when the sweep reads its loss (a busy machine).
    text = text.replace("--batch {batch}", "--batch {batch} --step-seconds 0.1")
    (d / "sweep.toml").write_text(text + f'\n[ssh]\nconfig = "{cluster.ssh_config}"\n')
    r = mh.ml("sweep", d / "sweep.toml", timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    (sweep_dir,) = list((mh.ml.home / "sweeps").iterdir())
    trials = json.loads((sweep_dir / "sweep.json").read_text())["trials"]
    assert len(trials) == 6 and trials[5]["state"] == "early-stopped", trials
    runs = {}
    for t in trials:
        rec = json.loads((mh.ml.home / "runs" / t["run"] / "run.json").read_text())
        assert [h["name"] for h in rec["hosts"]] == ["h1", "h2", "h3", "h4"] and len(rec["ranks"]) == 4
        runs[t["trial"]] = rec
    at = lambda iso: datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()  # noqa: E731
    spans = [(at(x["started_at"]), at(x["ended_at"])) for x in runs.values()]
    assert max(sum(1 for a, b in spans if a <= s < b) for s, _ in spans) <= 2, spans
    table = r.stdout[r.stdout.rindex("TRIAL"):].splitlines()[1:7]
    losses = [float(line.split()[4]) for line in table]  # trial, batch=, lr=, state, loss
    assert losses == sorted(losses), table
    assert "best: trial 2 (batch=16 lr=0.1): loss" in r.stdout and f"mltrain rerun {trials[2]['run']}" in r.stdout
