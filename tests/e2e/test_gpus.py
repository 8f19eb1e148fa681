"""GPU inventory and assignment on one host (the local agent), with the fake NVML and nvidia-smi
(tests/e2e/gpu_fakes.py): each rank's exact CUDA_VISIBLE_DEVICES for [gpus] per_proc and
procs_per_gpu, a host with too few GPUs or none failing preflight by name, a CUDA_VISIBLE_DEVICES
already set (in the job's env, or in the launcher's, which the local agent inherits), the
nvidia-smi fallback, doctor's listing and the dry run's note.
"""
import ctypes.util
import json
import re
import shutil
import socket

import pytest

import gpu_fakes

PROBE = 'echo "GPU $RANK $LOCAL_RANK ${CUDA_VISIBLE_DEVICES-unset} ${CUDA_DEVICE_ORDER-unset}"'
# The test machine's own settings must not leak into the local agent unless a test says so.
CLEAN = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


@pytest.fixture
def fakes(tmp_path):
    """Fakes of a host with 4 H100s; a test may rewrite fake-gpus.conf."""
    return gpu_fakes.install(tmp_path / "fakes", "* gpus 4\n")


def write_job(ml, fakes, gpus, nprocs, env=None, nvml=None, command=PROBE, extra=""):
    env = {"MLTRAIN_NVML_LIBRARY": str(nvml or fakes / "libnvidia-ml.so.1"), **(env or {})}
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in env.items())
    return ml.write("job.toml", f"""
[run]
command = '{command}'
[run.env]
{env_lines}
[cluster]
nprocs = {nprocs}
{extra}
[gpus]
{gpus}
""")


def devices(r):
    """{rank: (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER)} from the PROBE lines."""
    got = {}
    for line in r.stdout.splitlines():
        m = re.fullmatch(r"\[(\d+)\] GPU (\d+) (\d+) (\S+) (\S+)", line)
        if m:
            assert m[1] == m[2], line
            got[int(m[2])] = (m[4], m[5])
    return got


def run(ml, spec, **kw):
    return ml("run", spec, timeout=60, unset=CLEAN, **kw)


# --- assignment ----------------------------------------------------------------------------------

@pytest.mark.parametrize("gpus,nprocs,want", [
    ("per_proc = 1", 4, ["0", "1", "2", "3"]),
    ("per_proc = 2", 2, ["0,1", "2,3"]),
    ("procs_per_gpu = 2", 4, ["0", "0", "1", "1"]),
    ("per_proc = 4", 1, ["0,1,2,3"]),
], ids=["per_proc-1", "per_proc-2", "procs_per_gpu-2", "all-four"])
def test_each_rank_gets_its_gpus(ml, fakes, gpus, nprocs, want):
    r = run(ml, write_job(ml, fakes, gpus, nprocs))
    assert r.returncode == 0, r.stderr
    got = devices(r)
    assert [got[i][0] for i in range(nprocs)] == want, r.stdout
    assert {o for _, o in got.values()} == {"PCI_BUS_ID"}  # CUDA numbers GPUs as NVML does
    # The run record holds the environment the ranks got.
    rec = json.loads(ml("show", "--json", "latest").stdout)
    assert [x["env"]["CUDA_VISIBLE_DEVICES"] for x in rec["ranks"]] == want
    # And what the host's agent found: the GPUs' model, driver and CUDA (the fake NVML's defaults).
    facts = rec["hosts"][0]["environment"]
    assert facts["gpus"] == "4 x NVIDIA H100 80GB HBM3" and facts["gpu_driver"] == "580.95.05", facts
    assert facts["cuda"] == "13.0", facts


def test_too_few_gpus_fails_preflight_naming_the_host(ml, fakes):
    r = run(ml, write_job(ml, fakes, "per_proc = 2", 4))
    assert r.returncode == 255, r.stderr
    assert "preflight failed on 1 of 1 host; no rank was started:" in r.stderr
    assert ("  localhost: [gpus] per_proc = 2 for 4 ranks needs 8 GPUs; localhost has 4 "
            f"(GPU 0-3: {gpu_fakes.NAME})") in r.stderr, r.stderr
    assert "GPU 0 " not in r.stdout  # no rank ran
    (fakes / "fake-gpus.conf").write_text("* gpus 1\n")
    r = run(ml, write_job(ml, fakes, "procs_per_gpu = 2", 3))
    assert r.returncode == 255
    assert ("localhost: [gpus] procs_per_gpu = 2 for 3 ranks needs 2 GPUs; localhost has 1 "
            f"(GPU 0: {gpu_fakes.NAME})") in r.stderr, r.stderr


def test_a_host_without_gpus_says_why(ml, fakes):
    (fakes / "fake-gpus.conf").write_text("* gpus 0\n")  # NVML loads, the driver is "not loaded"
    r = run(ml, write_job(ml, fakes, "per_proc = 1", 1, env={"PATH": "/usr/bin:/bin"}))
    assert r.returncode == 255
    assert ("localhost: [gpus] per_proc = 1 but localhost has no GPU (no NVIDIA driver: "
            "nvmlInit: Driver Not Loaded, nvidia-smi not in PATH)") in r.stderr, r.stderr


def test_cuda_visible_devices_in_the_job_env_restricts_the_gpus(ml, fakes):
    r = run(ml, write_job(ml, fakes, "per_proc = 1", 2, env={"CUDA_VISIBLE_DEVICES": "3,1"}))
    assert r.returncode == 0, r.stderr
    assert {k: v[0] for k, v in devices(r).items()} == {0: "3", 1: "1"}  # in the list's order
    r = run(ml, write_job(ml, fakes, "per_proc = 1", 3, env={"CUDA_VISIBLE_DEVICES": "1,3"}))
    assert r.returncode == 255
    assert ("localhost: [gpus] per_proc = 1 for 3 ranks needs 3 GPUs; localhost has 2 usable "
            f"(CUDA_VISIBLE_DEVICES=1,3) of 4 (GPU 0-3: {gpu_fakes.NAME})") in r.stderr, r.stderr
    # As CUDA reads it: UUIDs count, and the list ends at the first entry naming no GPU.
    uuid2 = gpu_fakes.uuid(socket.gethostname(), 2)
    r = run(ml, write_job(ml, fakes, "per_proc = 1", 2, env={"CUDA_VISIBLE_DEVICES": f"{uuid2},0,9,1"}))
    assert r.returncode == 0, r.stderr
    assert {k: v[0] for k, v in devices(r).items()} == {0: "2", 1: "0"}


def test_cuda_visible_devices_of_the_launcher_reaches_the_local_agent(ml, fakes):
    spec = write_job(ml, fakes, "per_proc = 1", 2)
    r = ml("run", spec, timeout=60, env={"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert r.returncode == 0, r.stderr
    assert {k: v[0] for k, v in devices(r).items()} == {0: "2", 1: "3"}
    r = ml("run", spec, timeout=60, env={"CUDA_VISIBLE_DEVICES": ""}, unset=("CUDA_DEVICE_ORDER",))
    assert r.returncode == 255
    assert ("localhost: [gpus] per_proc = 1 but no GPU of localhost is usable (CUDA_VISIBLE_DEVICES=''; "
            f"localhost has 4: GPU 0-3: {gpu_fakes.NAME})") in r.stderr, r.stderr


def test_a_user_cuda_device_order_is_kept(ml, fakes):
    r = run(ml, write_job(ml, fakes, "per_proc = 1", 1, env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}))
    assert r.returncode == 0, r.stderr
    assert devices(r)[0] == ("0", "FASTEST_FIRST")


def test_nvidia_smi_is_the_fallback_when_nvml_does_not_load(ml, fakes, tmp_path):
    (fakes / "fake-gpus.conf").write_text("* gpus 2\n* mig 1\n")
    missing = tmp_path / "none" / "libnvidia-ml.so.1"
    env = {"PATH": f"{fakes}:/usr/bin:/bin"}
    r = run(ml, write_job(ml, fakes, "per_proc = 1", 2, env=env, nvml=missing))
    assert r.returncode == 0, r.stderr
    assert {k: v[0] for k, v in devices(r).items()} == {0: "0", 1: "1"}
    r = run(ml, write_job(ml, fakes, "per_proc = 1", 3, env=env, nvml=missing))
    assert r.returncode == 255
    assert f"localhost has 2 (GPU 0,1: {gpu_fakes.NAME})" in r.stderr, r.stderr

    d = ml("doctor", write_job(ml, fakes, "per_proc = 1", 1, env=env, nvml=missing), timeout=60, unset=CLEAN)
    assert d.returncode == 0, d.stderr
    host = socket.gethostname()
    assert (f"localhost: GPU 1: {gpu_fakes.NAME}, memory unknown, MIG on, {gpu_fakes.uuid(host, 1)}"
            in d.stdout), d.stdout
    assert (f"localhost: GPUs listed by nvidia-smi -L (MLTRAIN_NVML_LIBRARY={missing}: cannot open shared "
            "object file: No such file or directory)") in d.stdout, d.stdout


# --- doctor and the dry run ----------------------------------------------------------------------

def test_doctor_lists_the_inventory(ml, fakes):
    spec = write_job(ml, fakes, "per_proc = 1", 1)
    d = ml("doctor", spec, timeout=60, unset=CLEAN)
    assert d.returncode == 0, d.stderr
    header, row = d.stdout.splitlines()[:2]
    assert row.split()[header.split().index("GPUS")] == "4", d.stdout
    host = socket.gethostname()
    for i in range(4):
        assert (f"localhost: GPU {i}: {gpu_fakes.NAME}, 81559 MiB, MIG off, {gpu_fakes.uuid(host, i)}\n"
                in d.stdout), d.stdout

    j = ml("doctor", "--json", spec, timeout=60, unset=CLEAN)
    assert j.returncode == 0, j.stderr
    rep = json.loads(j.stdout)["hosts"][0]
    assert rep["facts"]["gpus"] == 4 and rep["facts"]["gpu_source"] == "nvml"
    assert rep["facts"]["gpu_driver"] == "580.95.05"
    assert rep["gpus"][3] == {"index": 3, "name": gpu_fakes.NAME, "uuid": gpu_fakes.uuid(host, 3),
                              "memory_mib": 81559, "mig": False}

    # A CUDA_VISIBLE_DEVICES in the job's env: doctor says what it leaves.
    spec = write_job(ml, fakes, "per_proc = 1", 1, env={"CUDA_VISIBLE_DEVICES": "0"})
    j = json.loads(ml("doctor", "--json", spec, timeout=60, unset=CLEAN).stdout)["hosts"][0]
    assert j["facts"]["cuda_visible_devices"] == "0" and j["facts"]["gpus_usable"] == 1
    d = ml("doctor", spec, timeout=60, unset=CLEAN)
    assert "localhost: CUDA_VISIBLE_DEVICES=0 leaves 1 usable" in d.stdout, d.stdout


def test_doctor_on_a_host_without_nvidia_software(ml):
    if shutil.which("nvidia-smi") or ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has NVIDIA software")
    d = ml("doctor", timeout=60, unset=CLEAN + ("MLTRAIN_NVML_LIBRARY",))
    assert d.returncode == 0, d.stderr
    assert ("localhost: no GPU (no NVIDIA driver: libnvidia-ml.so.1 not found, nvidia-smi not in PATH)"
            in d.stdout), d.stdout
    rep = json.loads(ml("doctor", "--json", timeout=60).stdout)["hosts"][0]
    assert rep["facts"]["gpus"] == 0 and rep["gpus"] == [] and rep["facts"]["gpu_source"] is None


def test_dry_run_says_gpus_are_checked_at_launch(ml, fakes):
    r = ml("run", "--dry-run", write_job(ml, fakes, "per_proc = 2", 2), unset=CLEAN)
    assert r.returncode == 0, r.stderr
    assert "[gpus] per_proc = 2 is checked against each host's GPU inventory at launch" in r.stdout
    assert "CUDA_VISIBLE_DEVICES=0,1" in r.stdout and "CUDA_VISIBLE_DEVICES=2,3" in r.stdout
    r = ml("run", "--dry-run", "-n", "2", "--", "true")
    assert "GPU inventory" not in r.stdout


def test_nccl_backend_cannot_share_a_gpu(ml, fakes):
    spec = write_job(ml, fakes, "procs_per_gpu = 2", 2, extra='[comm]\nbackend = "nccl"')
    r = run(ml, spec)
    assert r.returncode == 2
    assert ("[gpus] procs_per_gpu = 2 shares a GPU between ranks, but [comm] backend = \"nccl\"" in r.stderr
            and "NCCL refuses two ranks of one communicator on one GPU (\"Duplicate GPU detected\")"
            in r.stderr), r.stderr
