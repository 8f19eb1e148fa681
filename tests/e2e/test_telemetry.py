"""telemetry.jsonl (docs/json.md): each host's agent samples the host, its GPUs and its ranks
(with their comm counters) every MLTRAIN_TELEMETRY_INTERVAL, and the launcher writes one JSON line
per sample into the run's folder. A rank that makes the others wait shows the lowest share of time
inside collectives; GPU values the driver does not give are null."""
import json
import re
from pathlib import Path

import gpu_fakes

WORKERS = Path(__file__).resolve().parent / "py_workers"
PY = "/usr/bin/python3"


def telemetry(ml):
    (run,) = ml.run_dirs()
    path = run / "telemetry.jsonl"
    assert path.exists(), sorted(p.name for p in run.iterdir())
    return [json.loads(line) for line in path.read_text().splitlines()], path


def comm_shares(rows):
    """{rank: share of its time since init spent inside collectives}, from the last sample in
    which every rank had its counters."""
    for row in reversed(rows):
        ranks = row["ranks"]
        if ranks and all(r["comm_ns"] is not None and r["started_ns"] for r in ranks):
            now = row["monotonic_ns"]
            shares = {}
            for r in ranks:
                inside = r["comm_ns"] + (now - r["entered_ns"] if r["entered_ns"] else 0)
                shares[r["rank"]] = inside / max(1, now - r["started_ns"])
            return shares
    raise AssertionError("no sample with every rank's comm counters")


def test_samples_name_the_rank_the_others_wait_for(ml):
    r = ml("run", "-n", "4", "--", PY, WORKERS / "straggler.py", timeout=120,
           env={"MLTRAIN_TELEMETRY_INTERVAL": "200ms"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert len(re.findall(r"STRAGGLER-DONE \d", r.stdout)) == 4, r.stdout[-2000:]
    rows, path = telemetry(ml)
    assert len(rows) >= 5, len(rows)  # a run of about 4 s, sampled every 200 ms
    rec = json.loads(ml("show", "--json", "latest").stdout)
    pids = {k["rank"] if "rank" in k else i: k["pid"] for i, k in enumerate(rec["ranks"])}
    for row in rows:
        assert row["host"] and row["time_ms"] > 0
        assert row["cpus"] >= 1 and row["mem_total_bytes"] > 0 and row["mem_available_bytes"] > 0
        assert len(row["load"]) == 3
        assert {k["rank"]: k["pid"] for k in row["ranks"]}.items() <= pids.items(), (row["ranks"], pids)
    assert any(row["cpu_percent"] is not None for row in rows)  # rates from the second sample on
    assert any(k["rss_bytes"] and k["state"] for row in rows for k in row["ranks"])
    shares = comm_shares(rows)
    assert sorted(shares) == [0, 1, 2, 3], shares
    slow = shares.pop(1)
    # The others spend most of each 0.1 s step waiting for rank 1, which hardly waits at all.
    assert slow < 0.5 * min(shares.values()), (slow, shares)
    # About 1 KB a sample of 4 ranks (the size the records comment states).
    assert path.stat().st_size / len(rows) < 2000, path.stat().st_size / len(rows)


def test_gpu_rows_with_missing_values_null(ml, tmp_path):
    fakes = gpu_fakes.install(tmp_path / "fakes",
                              "* gpus 2\n* util 30\n* util.1 none\n* power_w none\n* temp_c 55\n")
    # Rank 0 puts itself on GPU 0 (the fake re-reads its conf on every call), then sleeps as itself.
    script = ml.write("rank.sh", f"""
if [ "$RANK" = 0 ]; then echo "* pids.0 $$:100" >> {fakes / 'fake-gpus.conf'}; fi
exec sleep 1.5
""")
    ml.write("job.toml", f"""
[run]
command = "exec sh {script}"
[run.env]
MLTRAIN_NVML_LIBRARY = "{fakes / 'libnvidia-ml.so.1'}"
[cluster]
nprocs = 2
""")
    r = ml("run", "job.toml", timeout=60, env={"MLTRAIN_TELEMETRY_INTERVAL": "200ms"},
           unset=("CUDA_VISIBLE_DEVICES",))
    assert r.returncode == 0, r.stderr
    rows, _ = telemetry(ml)
    with_gpus = [row for row in rows if row["gpus"]]
    assert with_gpus, rows[:2]
    assert any(row["gpus"][0]["processes"] for row in with_gpus), with_gpus[-1]
    for row in with_gpus:
        assert row["gpu_source"] == "nvml", row
        g0, g1 = row["gpus"]
        assert (g0["index"], g1["index"]) == (0, 1)
        assert g0["uuid"].startswith("GPU-") and g1["uuid"] != g0["uuid"]
        assert g0["util_percent"] == 30 and g1["util_percent"] is None
        assert g0["power_mw"] is None and g1["power_mw"] is None
        assert g0["temperature_c"] == 55 and g0["power_limit_mw"] == 700000
        assert g1["processes"] == []
        if g0["processes"]:  # once rank 0 wrote its line: named by its rank
            rank0 = next(k for k in row["ranks"] if k["rank"] == 0)
            assert g0["processes"] == [{"pid": rank0["pid"], "used_mib": 100, "rank": 0}], row
        assert [k["comm_ns"] for k in row["ranks"]] == [None] * len(row["ranks"])  # no comm library


def test_interval_zero_records_no_telemetry(ml):
    r = ml("run", "-n", "2", "--", "sleep", "0.5", env={"MLTRAIN_TELEMETRY_INTERVAL": "0"})
    assert r.returncode == 0, r.stderr
    (run,) = ml.run_dirs()
    assert not (run / "telemetry.jsonl").exists()


def test_a_bad_interval_is_a_usage_error_before_anything_starts(ml):
    r = ml("run", "-n", "1", "--", "true", env={"MLTRAIN_TELEMETRY_INTERVAL": "often"})
    assert r.returncode == 2, r.stderr
    assert "MLTRAIN_TELEMETRY_INTERVAL='often' is not a duration" in r.stderr
    assert ml.run_dirs() == []


# A busy program under `command = "..."` (the README's form): the rank's CPU and memory are the
# program's, whether its shell execs it (one plain command) or waits for it (a pipeline). Both read
# "0% 1.4M" (the idle shell) before.
BUSY = "import time\nx = bytearray(b'1' * (64 << 20))\nt = time.time()\nwhile time.time() - t < 2.5: pass\nprint('busy done')"


def test_a_command_ranks_cpu_and_memory_are_its_programs(ml):
    busy = ml.write("busy.py", BUSY)
    for i, command in enumerate((f"{PY} {busy}", f"{PY} {busy} | cat")):
        spec = ml.write(f"busy{i}.toml", f'[run]\ncommand = "{command}"\n')
        r = ml("run", spec, timeout=120, env={"MLTRAIN_TELEMETRY_INTERVAL": "200ms"})
        assert r.returncode == 0 and "busy done" in r.stdout, r.stderr
        (run,) = [d for d in ml.run_dirs() if f"-busy{i}-" in d.name]
        rows = [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
        ranks = [k for row in rows for k in row["ranks"]]
        # The memory it holds; CPU it uses, however little a busy machine leaves it (the shell's is 0).
        assert max(k["rss_bytes"] or 0 for k in ranks) > 64 << 20, (command, ranks)
        assert max(k["cpu_percent"] or 0 for k in ranks) >= 1, (command, ranks)
