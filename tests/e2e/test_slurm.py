"""The Slurm transport against a real Slurm (Debian's slurmctld, slurmd and munge) on the test
cluster (tests/cluster/slurm.sh: slurmctld here, one slurmd in each host's namespaces). Inside
`salloc -N3`, `mltrain run` starts each node's agent as an srun step; a rank crash stops every
rank on every node; `scancel` and SIGKILL of the launcher leave nothing; `mltrain sbatch` runs a
job to its end with its output in the run's records. Skipped where Slurm is not installed
(apt-get install slurmctld slurmd slurm-client munge)."""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import pids_with_arg, wait_for, wait_gone
from multihost_fixtures import module_cluster

N = 3


def _slurm_down():
    subprocess.run([os.path.join(os.path.dirname(__file__), "..", "cluster", "slurm.sh"), "down"],
                   capture_output=True, timeout=60)


cluster = module_cluster(n=N, etc_hosts=True, before_down=_slurm_down)


@pytest.fixture(scope="module")
def slurm(cluster):  # noqa: F811
    for tool in ("slurmctld", "slurmd", "srun", "munged"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            pytest.skip(f"{tool} is not installed (apt-get install slurmctld slurmd slurm-client munge)")
    script = os.path.join(os.path.dirname(__file__), "..", "cluster", "slurm.sh")
    r = subprocess.run([script, "up", "-d", str(cluster.dir), "-n", str(N)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return {"SLURM_CONF": str(cluster.dir / "slurm" / "slurm.conf")}


def env_of(ml, slurm):
    e = dict(ml.env)
    e.update(slurm)
    return e


def salloc(ml, slurm, *args, nodes=N, per_node=2, timeout=120):
    return subprocess.run(["salloc", "-N", str(nodes), f"--ntasks-per-node={per_node}", "--quiet", ml.bin,
                           *map(str, args)], env=env_of(ml, slurm), capture_output=True, text=True,
                          timeout=timeout, cwd="/tmp")


def no_jobs(slurm):
    r = subprocess.run(["squeue", "-h"], env={**os.environ, **slurm}, capture_output=True, text=True)
    return r.returncode == 0 and not r.stdout.strip()


def test_inside_salloc_every_rank_starts_through_srun_with_its_environment(ml, slurm):
    script = 'echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK N=$NODE_RANK M=$MASTER_ADDR H=$(hostname) J=$SLURM_JOB_ID"'
    r = salloc(ml, slurm, "run", "--", "sh", "-c", script)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(re.findall(r"R=\d+ .*", r.stdout))
    assert len(lines) == 2 * N, r.stdout
    jobs = set()
    for line in lines:
        f = dict(kv.split("=", 1) for kv in line.split())
        rank = int(f["R"])
        assert f["W"] == str(2 * N) and f["L"] == str(rank % 2) and f["N"] == str(rank // 2), line
        assert f["H"] == f"h{rank // 2 + 1}" and f["M"] == "h1", line
        jobs.add(f["J"])
    assert len(jobs) == 1 and jobs.pop().isdigit(), lines  # SLURM_* left as Slurm set them
    show = json.loads(ml("show", "--json", "latest").stdout)
    assert show["slurm_job_id"] and show["slurm_job_id"].isdigit(), show
    assert "slurm job" in ml("ls").stdout
    wait_for(lambda: no_jobs(slurm), 30, "the allocation to end")


def test_a_rank_crash_stops_every_rank_on_every_node(ml, slurm):
    marker = ml.marker()
    script = f'if [ "$RANK" = 3 ]; then sleep 1; exit 7; fi; exec sleep 300 {marker}'
    t0 = time.monotonic()
    r = salloc(ml, slurm, "run", "--", "sh", "-c", script)
    assert r.returncode == 7, r.stdout + r.stderr
    assert re.search(r"h2 \(slurm\): rank 3 failed with exit code 7", r.stderr), r.stderr
    assert time.monotonic() - t0 < 60
    assert not wait_gone(marker, within_s=15), "ranks left behind"
    wait_for(lambda: no_jobs(slurm), 30, "the allocation to end")


def _start_in_allocation(ml, slurm, marker):
    p = subprocess.Popen(["salloc", "-N", str(N), "--ntasks-per-node=1", "--quiet", ml.bin, "run", "--", "sh",
                          "-c", f"exec sleep 300 {marker}"], env=env_of(ml, slurm), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd="/tmp", start_new_session=True)
    wait_for(lambda: len(pids_with_arg(marker)) == N, 60, "every rank running")
    return p


def test_scancel_of_the_allocation_leaves_nothing(ml, slurm):
    marker = ml.marker()
    p = _start_in_allocation(ml, slurm, marker)
    job = subprocess.run(["squeue", "-h", "-o", "%i"], env={**os.environ, **slurm}, capture_output=True,
                         text=True).stdout.split()
    assert len(job) == 1, job
    subprocess.run(["scancel", job[0]], env={**os.environ, **slurm}, check=True)
    p.communicate(timeout=60)
    assert not wait_gone(marker, within_s=20), "ranks left behind after scancel"
    wait_for(lambda: no_jobs(slurm), 30, "the allocation to end")


def test_sigkill_of_the_launcher_leaves_nothing(ml, slurm):
    marker = ml.marker()
    p = _start_in_allocation(ml, slurm, marker)
    launcher = [pid for pid in pids_with_arg("run") if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0]
                == ml.bin.encode()]
    assert len(launcher) == 1, launcher
    os.kill(launcher[0], signal.SIGKILL)
    assert not wait_gone(marker, within_s=20), "ranks left behind after the launcher was killed"
    p.communicate(timeout=60)
    wait_for(lambda: no_jobs(slurm), 30, "the allocation to end")


def test_sbatch_runs_a_job_to_its_end_with_its_output_in_the_records(ml, slurm):
    spec = ml.write("batch.toml", 'name = "batchjob"\n[run]\ncommand = "echo batch rank $RANK on $(hostname)"\n'
                                  "[cluster]\nprocs_per_host = 2\n")
    r = ml("sbatch", spec, "--nodes", "2", "--print", env=slurm)
    assert r.returncode == 0 and "#SBATCH --nodes=2" in r.stdout and "--launcher slurm" in r.stdout, r.stderr
    r = ml("sbatch", spec, "--nodes", "2", env=slurm, timeout=60)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    assert job.isdigit(), r.stdout
    wait_for(lambda: no_jobs(slurm), 90, "the batch job to end")
    runs = [json.loads((d / "run.json").read_text()) for d in ml.run_dirs()]
    mine = [x for x in runs if x.get("slurm_job_id") == job]
    assert len(mine) == 1, runs
    assert mine[0]["status"] == "succeeded", mine[0]
    logs = ml("logs", mine[0]["id"]).stdout
    assert sorted(re.findall(r"batch rank (\d) on (h\d)", logs)) == [("0", "h1"), ("1", "h1"), ("2", "h2"),
                                                                      ("3", "h2")], logs
