"""`mltrain knobs`: the one table of environment variables, and the comm library reading through it."""
import json
import re

from conftest import REPO


def _names_in_comm_docs():
    """Variable names in docs/comm.md's Environment table."""
    text = (REPO / "docs" / "comm.md").read_text()
    section = text.split("## Environment", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_table_is_aligned_and_lists_the_comm_knobs(ml):
    r = ml("knobs")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = lines[0]
    assert header.split() == ["VARIABLE", "DEFAULT", "WHO", "MEANING"]
    default_col, who_col = header.index("DEFAULT"), header.index("WHO")
    rows = {}
    for line in lines[1:]:
        name = line.split()[0]
        # Every row's columns start where the header's do.
        assert line[default_col - 2:default_col] == "  " and line[default_col] != " ", line
        assert line[who_col - 2:who_col] == "  " and line[who_col] != " ", line
        rows[name] = (line[default_col:who_col].strip(), line[who_col:].split()[0])
    assert rows["MLTRAIN_COMM_TIMEOUT"] == ("300s", "comm")
    assert rows["MLTRAIN_HOME"][1] == "launcher"
    assert rows["PATH"][1] == "agent"
    # Every variable docs/comm.md documents is in the one table (no second list drifting away).
    assert _names_in_comm_docs() <= set(rows), _names_in_comm_docs() - set(rows)


def test_json_has_each_knob_once_with_its_current_value(ml):
    r = ml("knobs", "--json", env={"MLTRAIN_COMM_ALGO": "hd"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == 1
    knobs = doc["knobs"]
    names = [k["name"] for k in knobs]
    assert len(names) == len(set(names))
    by_name = {k["name"]: k for k in knobs}
    assert by_name["MLTRAIN_COMM_ALGO"]["value"] == "hd"
    assert by_name["MLTRAIN_COMM_ALGO"]["kind"] == "auto|ring|bidir|hd|direct"
    assert by_name["MLTRAIN_COMM_TIMEOUT"]["value"] is None
    assert by_name["MLTRAIN_COMM_TIMEOUT"]["kind"] == "duration"


def _bench_worker(ml, timeout_value):
    # The benchmark the agent delivered, in a one-rank job.
    return ml("run", "-n", "1", "--env", f"MLTRAIN_COMM_TIMEOUT={timeout_value}", "--", "sh", "-c",
              'exec "$MLTRAIN_RUNTIME/bin/mltrain-comm-bench" -b 4K -e 4K --iters 2 --warmup 0')


def test_comm_reads_durations_with_units(ml):
    # "5m" was once read by strtod as 5 seconds; now it is the spec's duration parser.
    assert _bench_worker(ml, "5m").returncode == 0
    r = _bench_worker(ml, "5x")
    assert r.returncode != 0
    assert ("MLTRAIN_COMM_TIMEOUT='5x' is not a duration (write it like 90s, 5m, 1h30m"
            in r.stderr), r.stderr


def test_the_python_package_reads_only_declared_knobs(ml):
    # python/mltrain/_env.py is the package's one reader of the environment.
    r = ml("knobs", "--json")
    assert r.returncode == 0, r.stderr
    declared = {k["name"] for k in json.loads(r.stdout)["knobs"]}
    text = (REPO / "python" / "mltrain" / "_env.py").read_text()
    names = set(re.findall(r'"([A-Z][A-Z0-9_]+)"', text))
    assert names and names <= declared, names - declared
    for path in (REPO / "python" / "mltrain").glob("*.py"):
        if path.name != "_env.py":
            assert "os.environ" not in path.read_text() and "getenv" not in path.read_text(), path
