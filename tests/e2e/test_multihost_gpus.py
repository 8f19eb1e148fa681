"""GPU inventory and assignment across hosts: 2 test-cluster hosts (tests/cluster/) x 4 fake GPUs
each (tests/e2e/gpu_fakes.py; the hosts share the file system, so one copy of the fakes serves
both, and fake-gpus.conf lines per host name give each host its own inventory). Every rank's exact
CUDA_VISIBLE_DEVICES, or preflight failing with a line naming the host.

Needs root and network namespaces; skipped otherwise (reason from cluster.available()).
"""
import json
import re

import pytest

import gpu_fakes
from multihost_fixtures import MultiHost, module_cluster, shared_root  # noqa: F401 (fixture)

cluster = module_cluster(n=2)

PROBE = 'echo "GPU $RANK $(hostname) ${CUDA_VISIBLE_DEVICES-unset} ${CUDA_DEVICE_ORDER-unset}"'


@pytest.fixture
def mh(ml, cluster, shared_root, request):  # noqa: F811
    d = shared_root / request.node.name.replace("[", "_").replace("]", "_")
    d.mkdir()
    d.chmod(0o1777)
    yield MultiHost(ml, cluster, d)


def job(mh, conf, gpus, hosts="h1:4,h2:4", env=None):
    """A spec running PROBE on `hosts` with fakes (in the shared folder, which the cluster's login
    user can read) whose fake-gpus.conf is `conf`."""
    fakes = gpu_fakes.install(mh.shared / f"fakes-{len(list(mh.shared.glob('fakes-*')))}", conf)
    env = {"MLTRAIN_NVML_LIBRARY": str(fakes / "libnvidia-ml.so.1"), **(env or {})}
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in env.items())
    return mh.ml.write("job.toml", f"""
[run]
command = '{PROBE}'
workdir = "/tmp"
[run.env]
{env_lines}
[cluster]
hosts = ["{hosts}"]
[gpus]
{gpus}
""")


def devices(r):
    """[(host, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER)] by rank."""
    got = {}
    for line in r.stdout.splitlines():
        m = re.search(r"GPU (\d+) (\S+) (\S+) (\S+)$", line)
        if m:
            got[int(m[1])] = (m[2], m[3], m[4])
    return [got[i] for i in sorted(got)]


@pytest.mark.parametrize("gpus,hosts,want", [
    ("per_proc = 1", "h1:4,h2:4", ["0", "1", "2", "3"] * 2),
    ("per_proc = 2", "h1:2,h2:2", ["0,1", "2,3"] * 2),
    ("procs_per_gpu = 2", "h1:4,h2:4", ["0", "0", "1", "1"] * 2),
], ids=["per_proc-1", "per_proc-2", "procs_per_gpu-2"])
def test_each_rank_gets_its_gpus_on_every_host(mh, gpus, hosts, want):
    r = mh.run(job(mh, "* gpus 4\n", gpus, hosts), timeout=90)
    assert r.returncode == 0, r.stderr
    got = devices(r)
    per_host = len(want) // 2
    assert [h for h, _, _ in got] == ["h1"] * per_host + ["h2"] * per_host, r.stdout
    assert [d for _, d, _ in got] == want, r.stdout
    assert {o for _, _, o in got} == {"PCI_BUS_ID"}
    assert [x["env"]["CUDA_VISIBLE_DEVICES"] for x in mh.show()["ranks"]] == want


def test_a_host_with_too_few_gpus_is_named(mh):
    r = mh.run(job(mh, "* gpus 4\nh2 gpus 2\n", "per_proc = 1"), timeout=90)
    assert r.returncode == 255, r.stderr
    assert "preflight failed on 1 of 2 hosts; no rank was started:" in r.stderr, r.stderr
    assert (f"  h2: [gpus] per_proc = 1 for 4 ranks needs 4 GPUs; h2 has 2 (GPU 0,1: {gpu_fakes.NAME})"
            in r.stderr), r.stderr
    assert "  h1:" not in r.stderr
    assert not devices(r)


def test_a_host_without_gpus_is_named_with_the_reason(mh):
    r = mh.run(job(mh, "* gpus 4\nh1 gpus 0\n", "per_proc = 2", hosts="h1:1,h2:2"), timeout=90)
    assert r.returncode == 255, r.stderr
    assert ("  h1: [gpus] per_proc = 2 but h1 has no GPU (no NVIDIA driver: nvmlInit: Driver Not Loaded, "
            "nvidia-smi not in PATH)") in r.stderr, r.stderr
    assert "  h2:" not in r.stderr


def test_cuda_visible_devices_in_the_job_env_restricts_every_host(mh):
    r = mh.run(job(mh, "* gpus 4\n", "per_proc = 1", hosts="h1:2,h2:2", env={"CUDA_VISIBLE_DEVICES": "1,3"}),
               timeout=90)
    assert r.returncode == 0, r.stderr
    assert [d for _, d, _ in devices(r)] == ["1", "3", "1", "3"]
    r = mh.run(job(mh, "* gpus 4\nh2 gpus 2\n", "per_proc = 1", hosts="h1:2,h2:2",
                   env={"CUDA_VISIBLE_DEVICES": "1,3"}), timeout=90)
    assert r.returncode == 255
    # On h2 (2 GPUs) the list ends at 3: one usable GPU for two ranks.
    assert ("  h2: [gpus] per_proc = 1 for 2 ranks needs 2 GPUs; h2 has 1 usable (CUDA_VISIBLE_DEVICES=1,3) "
            f"of 2 (GPU 0,1: {gpu_fakes.NAME})") in r.stderr, r.stderr


def test_a_slow_gpu_probe_on_one_host_loses_no_other(mh):
    # h2's NVML takes 12 s, longer than the 10 s an agent (and the launcher) waits on silence: the
    # launcher keeps h1 pinged meanwhile, so h1 is neither lost nor gives up on the launcher.
    # Telemetry off: its sampling runs on the agent's event loop, where a second 12 s nvmlInit would
    # block h2's answers to pings (a known limit: sampling belongs on a thread of its own).
    r = mh.run(job(mh, "* gpus 4\nh2 init_delay_ms 12000\n", "per_proc = 1", hosts="h1:2,h2:2"), timeout=90,
               env={"MLTRAIN_TELEMETRY_INTERVAL": "0"})
    assert r.returncode == 0, r.stderr
    assert [(h, d) for h, d, _ in devices(r)] == [("h1", "0"), ("h1", "1"), ("h2", "0"), ("h2", "1")]


def test_doctor_lists_each_hosts_gpus(mh, cluster):
    spec = job(mh, "* gpus 4\nh2 gpus 2\nh2 mig 1\n", "per_proc = 1", hosts="h1,h2")
    d = mh.ml("doctor", "--ssh-config", cluster.ssh_config, spec, timeout=90)
    assert d.returncode == 0, d.stderr
    for i in range(4):
        assert (f"h1: GPU {i}: {gpu_fakes.NAME}, 81559 MiB, MIG off, {gpu_fakes.uuid('h1', i)}\n"
                in d.stdout), d.stdout
    assert f"h2: GPU 1: {gpu_fakes.NAME}, 81559 MiB, MIG on, {gpu_fakes.uuid('h2', 1)}\n" in d.stdout
    assert "h2: GPU 2:" not in d.stdout
    j = mh.ml("doctor", "--json", "--ssh-config", cluster.ssh_config, spec, timeout=90)
    rep = {h["host"]: h for h in json.loads(j.stdout)["hosts"]}
    assert rep["h1"]["facts"]["gpus"] == 4 and rep["h2"]["facts"]["gpus"] == 2
    assert [g["uuid"] for g in rep["h2"]["gpus"]] == [gpu_fakes.uuid("h2", i) for i in range(2)]
