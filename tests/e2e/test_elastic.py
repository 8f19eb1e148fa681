"""Restarts that resume, and the elastic keys outside `mltrain run` (docs/elastic.md). The lost
host, the spare and the 20 s restart: test_multihost_elastic.py on the test cluster."""
import re
import shutil
from pathlib import Path

from test_export import K8S_SPEC, export, manifest
from test_python import needs_torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic"


@needs_torch
def test_the_example_fails_once_and_its_restart_resumes_from_the_checkpoint(ml):
    d = ml.dir / "elastic"
    shutil.copytree(EXAMPLE, d)
    r = ml("run", d / "job.toml", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 1 fails at step 20 (on purpose, once)" in r.stdout
    assert "restarting the gang (restart 1 of 2)" in r.stderr
    after = r.stdout[r.stdout.index("restart 1"):]
    assert "[0] rank 0 resumed from step 20" in after and "[1] rank 1 resumed from step 20" in after, after[:2000]
    assert re.search(r"\[0\] rank 0/2 step 20 ", after) and not re.search(r"step 1?\d ", after), after[:2000]
    digests = set(re.findall(r"final weights sha256 (\w+)", r.stdout))
    assert len(digests) == 1, r.stdout[-2000:]


def test_spares_are_shown_before_the_run_and_refused_where_they_cannot_serve(ml):
    spec = ml.write("job.toml", '[run]\ncommand = "true"\nmax_restarts = 1\n'
                                '[cluster]\nhosts = ["a:2", "b:2"]\nmin_hosts = 1\nspares = ["c"]\n')
    r = ml("run", "--dry-run", spec)
    assert r.returncode == 0, r.stderr
    assert "4 ranks on 2 hosts + 1 spare" in r.stdout
    assert "host c (spare): no rank until it takes a lost host's place" in r.stdout
    r = ml("sbatch", spec)
    assert r.returncode == 2 and "job.toml:7:10: spares are for hosts reached over SSH" in r.stderr, r.stderr


def test_export_drops_spares_with_a_warning(ml):
    ml.write("job.toml", K8S_SPEC.replace("procs_per_host = 4", 'procs_per_host = 4\nmin_hosts = 2\nspares = ["x"]'))
    r = export(ml, "pytorchjob", "job.toml")
    assert r.returncode == 0 and "min_hosts and spares are mltrain run's elastic restarts" in r.stderr, r.stderr
    doc, _ = manifest(ml, "pytorchjob", warnings=True)  # and it fits the CRD, 3 pods as before
    assert doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
