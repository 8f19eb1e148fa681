"""`mltrain top --once --json --hostfile F` on the 4-host test cluster (tests/cluster/): a run
started by another launcher, each host with 2 fake GPUs (tests/e2e/gpu_fakes.py) whose processes
are the ranks themselves; top connects to the hosts on its own, and every host comes back with
CPU, memory and network figures and every GPU process with its rank. The telemetry of the run
itself (show's summary) on the same cluster."""
import json
import shutil
import time

import gpu_fakes
from multihost_fixtures import cluster, mh, shared_root  # noqa: F401 (fixtures)
from test_top import PY, WORKERS

HOSTS = ("h1", "h2", "h3", "h4")


def test_top_on_hosts_maps_every_gpu_process_to_its_rank(mh):
    fakes = gpu_fakes.install(mh.shared / "fakes", "* gpus 2\n* util 60\n* mem_used_mib 4096\n")
    conf = fakes / "fake-gpus.conf"
    conf.chmod(0o666)  # the ranks (the cluster's login user) add their pids
    worker = mh.shared / "straggler.py"
    shutil.copy(WORKERS / "straggler.py", worker)
    worker.chmod(0o644)
    # Each rank puts its own pid on GPU LOCAL_RANK of its host, then runs the allreduce loop
    # (exec: the python process keeps the pid), rank 1 sleeping before each step.
    rank = (f'echo "$(hostname) pids.$LOCAL_RANK $$:2048" >> {conf} && exec {PY} {worker}')
    lib = fakes / "libnvidia-ml.so.1"
    r = mh.ml("run", *mh.args("-d", "-H", ",".join(f"{h}:2" for h in HOSTS), "--workdir", "/tmp",
                              "--env", "STEPS=400", "--env", "DELAY=0.05", "--env", f"MLTRAIN_NVML_LIBRARY={lib}",
                              "--", "sh", "-c", rank), timeout=120)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()

    hostfile = mh.ml.write("hosts.txt", "".join(f"{h}\n" for h in HOSTS))
    deadline = time.monotonic() + 90
    while True:
        t = mh.ml("top", "--once", "--json", *mh.args("--hostfile", hostfile),
                  env={"MLTRAIN_NVML_LIBRARY": str(fakes / "libnvidia-ml.so.1")}, timeout=120)
        assert t.returncode == 0, t.stderr
        snap = json.loads(t.stdout)
        mapped = [p for g in snap["gpus"] for p in g["processes"] if p["rank"] is not None]
        if len(mapped) == 8 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert snap["run"] is None and snap["problems"] == [], snap["problems"]
    assert [h["host"] for h in snap["hosts"]] == list(HOSTS)
    for h in snap["hosts"]:
        for k in ("cpus", "cpu_percent", "mem_total_bytes", "mem_available_bytes", "net_rx_bytes_per_s",
                  "net_tx_bytes_per_s"):
            assert h[k] is not None, (k, h)
        assert h["gpu_source"] == "nvml" and h["gpus"] == 2 and h["gpu_util_mean"] == 60
    assert [(g["host"], g["index"]) for g in snap["gpus"]] == [(h, i) for h in HOSTS for i in (0, 1)]
    # GPU i of host hK runs local rank i: global rank 2(K-1) + i.
    for g in snap["gpus"]:
        k = HOSTS.index(g["host"])
        assert [p["rank"] for p in g["processes"]] == [2 * k + g["index"]], g
        assert g["ranks"] == [2 * k + g["index"]] and g["util_percent"] == 60 and g["mem_used_mib"] == 4096
    assert sorted(k["rank"] for k in snap["ranks"]) == list(range(8))
    for k in snap["ranks"]:
        assert k["host"] == HOSTS[k["rank"] // 2] and k["gpus"] == [k["rank"] % 2], k

    mh.ml("stop", run_id, timeout=60)
    show = mh.ml("show", "--json", run_id)
    u = json.loads(show.stdout)["utilization"]
    assert u and sorted(u["hosts"]) == list(HOSTS)
    assert len(u["gpus"]) == 8 and all(g["util_mean"] == 60 for g in u["gpus"]), u["gpus"]
    assert sorted(k["rank"] for k in u["ranks"]) == list(range(8))
