"""`mltrain sweep` (docs/sweep.md): a trial per combination of [sweep]'s parameters, each an
ordinary run linked to its sweep, at most max_parallel at once, ranked by the metric the trials
log; median stopping; --resume after Ctrl-C runs only the trials that did not finish."""
import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sweep"


def sweep_spec(ml, steps=40, step_seconds=0.1, extra=""):
    """The example's sweep, its trainer copied beside the spec (4 s a trial: the diverging one must
    still run when the sweep reads its loss, on a busy machine too)."""
    d = ml.dir / "sw"
    d.mkdir(exist_ok=True)
    (d / "train.py").write_text((EXAMPLE / "train.py").read_text())
    text = (EXAMPLE / "sweep.toml").read_text().replace(
        "--batch {batch}", f"--batch {{batch}} --steps {steps} --step-seconds {step_seconds}")
    (d / "sweep.toml").write_text(text + extra)
    return d / "sweep.toml"


def sweep_doc(ml):
    (d,) = list((ml.home / "sweeps").iterdir())
    return json.loads((d / "sweep.json").read_text())


def records(ml):
    out = []
    for d in ml.run_dirs():
        r = json.loads((d / "run.json").read_text())
        if r["sweep"]:
            out.append(r)
    return out


def at(iso):
    return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def test_a_grid_sweep_runs_every_trial_two_at_a_time_stops_the_bad_one_and_ranks_them(ml):
    r = ml("sweep", sweep_spec(ml), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = sweep_doc(ml)
    trials = doc["trials"]
    assert [t["params"] for t in trials] == [{"batch": b, "lr": lr} for b in ("16", "32")
                                            for lr in ("0.01", "0.001", "0.1")]
    # Every trial is an ordinary run that says which trial it is.
    recs = {r["sweep"]["trial"]: r for r in records(ml)}
    assert sorted(recs) == list(range(6)) and all(r["sweep"]["id"] == doc["id"] for r in recs.values())
    assert all(trials[n]["run"] == recs[n]["id"] for n in recs)
    assert "--lr 0.1 --batch 32" in " ".join(recs[5]["argv"]) or "--lr 0.1 --batch 32" in recs[5]["spec_text"]
    # Never more than two at once.
    spans = [(at(r["started_at"]), at(r["ended_at"])) for r in recs.values()]
    most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert most <= 2, spans
    # The diverging trial (lr 0.1, batch 32) was stopped early, and its record says so; a trial
    # stopped is one whose loss was above the median of the finished ones at its step.
    states = {t["trial"]: t["state"] for t in trials}
    assert states[5] == "early-stopped" and trials[5]["step"] < 39, trials[5]
    # ... in `ls` too, not "stopped" as if a person had stopped it (issue 47 item 16).
    assert recs[5]["status"] == "early-stopped", recs[5]["status"]
    listed = ml("ls", "--where", "status = early-stopped", "--columns", "id,status").stdout
    assert recs[5]["id"] in listed and "early-stopped" in listed, listed
    assert set(states.values()) <= {"succeeded", "early-stopped"} and states[0] == states[1] == "succeeded", states
    for n, s in states.items():
        assert (trials[n]["step"] == 39) == (s == "succeeded"), trials[n]
    # The final table sorted by the metric (lower is better), the best trial's rerun line last.
    table = r.stdout[r.stdout.rindex("TRIAL"):].splitlines()
    order = [int(l.split()[0]) for l in table[1:7]]
    finals = {t["trial"]: t["metric"] for t in trials}
    assert [finals[n] for n in order] == sorted(finals.values()), (order, finals)
    best = min((n for n in states if states[n] == "succeeded"), key=lambda n: finals[n])
    assert best == 2  # batch 16, lr 0.1: the fastest fall that does not diverge
    assert f"best: trial 2 (batch=16 lr=0.1): loss" in r.stdout, r.stdout
    assert f"  mltrain rerun {trials[best]['run']}" in r.stdout
    # A trial is a run like any other: ls finds the sweep's runs by their metric.
    ls = ml("ls", "--where", "metric.loss < 0.1", "--columns", "name")
    assert sorted(ls.stdout.split()[1:]) == sorted(f"sweep-example-t{n}" for n in range(6) if finals[n] < 0.1)


def test_ctrl_c_stops_the_sweep_and_resume_runs_only_the_rest(ml):
    spec = sweep_spec(ml, steps=30, step_seconds=0.1, extra="")
    p = subprocess.Popen([ml.bin, "sweep", str(spec)], env=ml._env(), cwd=str(ml.dir), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            done = [t for t in sweep_doc(ml)["trials"] if t["state"] == "succeeded"]
        except (ValueError, FileNotFoundError):
            done = []
        if len(done) >= 2:
            break
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGINT)  # Ctrl-C reaches the sweep and its trials
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert "go on with: mltrain sweep --resume" in err
    first = {t["trial"]: t["state"] for t in sweep_doc(ml)["trials"]}
    finished = {n for n, s in first.items() if s in ("succeeded", "failed", "early-stopped")}
    assert len(finished) >= 2 and any(s == "interrupted" for s in first.values()), first
    before = {r["id"] for r in records(ml)}

    r = ml("sweep", "--resume", "latest", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    new = [x for x in records(ml) if x["id"] not in before]
    assert sorted(x["sweep"]["trial"] for x in new) == sorted(set(range(6)) - finished)
    assert all(t["state"] in ("succeeded", "early-stopped") for t in sweep_doc(ml)["trials"])


def test_bad_sweeps_are_clear_errors(ml):
    d = ml.dir
    cases = {
        "none.toml": ('[run]\ncommand = "true"\n[sweep]\nmax_parallel = 2\n', "none.toml:3:1: [sweep] names no parameter"),
        "grid.toml": ('[run]\ncommand = "true"\n[sweep.grid]\nlr = 0.1\n', "must be a non-empty array"),
        "random.toml": ('[run]\ncommand = "true"\n[sweep.random]\nlr = { min = 1, max = 0 }\n', "needs min < max"),
        "draws.toml": ('[run]\ncommand = "true"\n[sweep.random]\nlr = { min = 0, max = 1 }\n', "draws.toml:3:1: [sweep.random] needs [sweep] trials"),
        "median.toml": ('[run]\ncommand = "true"\n[sweep]\nearly_stop = "median"\n[sweep.grid]\nx = [1]\n',
                        "median.toml:4:14: [sweep] early_stop = \"median\" needs a metric"),
        # Counted before it is made: 10^7 trials would fill the memory (it did).
        "huge.toml": ('[run]\ncommand = "true"\n[sweep.grid]\n' +
                      "".join(f"p{k} = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n" for k in range(7)),
                      "huge.toml:3:1: [sweep] makes 10000000 trials, more than 100000"),
        "intless.toml": ('[run]\ncommand = "true"\n[sweep]\ntrials = 2\n[sweep.random]\n'
                         'n = { min = 0.2, max = 0.7, int = true }\n', "intless.toml:5:1: [sweep.random] n: no integer lies between min = 0.2"),
        "both.toml": ('[run]\ncommand = "true"\n[sweep.grid]\nx = [1, 2]\n[[sweep.list]]\nx = 3\n',
                      "both.toml:5:1: [[sweep.list]] is given with [sweep.grid]"),
        # A parameter [run] never uses would run every trial alike: {learning_rate} is not lr.
        "unused.toml": ('[run]\ncommand = "train --lr {learning_rate} --batch {batch}"\n'
                        '[sweep.grid]\nlr = [0.1, 0.01]\nbatch = [16]\n',
                        "unused.toml:3:1: [sweep] parameter lr appears nowhere in [run]"),
        "unused_list.toml": ('[run]\nargv = ["train", "{a}"]\n[[sweep.list]]\na = 1\n[[sweep.list]]\na = 2\nb = 3\n',
                             "unused_list.toml:3:1: [[sweep.list]] trial 0 has no b, which another trial has"),
        "unused_list2.toml": ('[run]\nargv = ["train", "{a}"]\n[[sweep.list]]\na = 1\nb = 2\n[[sweep.list]]\na = 2\nb = 3\n',
                              "unused_list2.toml:3:1: [sweep] parameter b appears nowhere in [run]"),
    }
    for name, (text, said) in cases.items():
        (d / name).write_text(text)
        r = ml("sweep", name)  # named as given: the error says where in it
        assert r.returncode == 2 and said in r.stderr, (name, r.stderr)
        r = ml("validate", name)  # found before any trial runs
        assert r.returncode == 2 and said in r.stderr, (name, r.stderr)
    assert not (ml.home / "sweeps").exists() or not list((ml.home / "sweeps").iterdir())
    r = ml("run", d / "grid.toml")
    assert r.returncode == 2, r.stderr
    # A parameter [run.env] uses is used: one job run twice.
    (d / "repeat.toml").write_text('[run]\ncommand = "echo r=$REPEAT"\n[run.env]\nREPEAT = "{repeat}"\n'
                                   '[sweep.grid]\nrepeat = [1, 2]\n')
    r = ml("sweep", d / "repeat.toml", timeout=120)
    assert r.returncode == 0 and "2 trials (2 to run)" in r.stderr, r.stdout + r.stderr
    (sweep,) = (ml.home / "sweeps").iterdir()
    assert "r=1" in (sweep / "trial-0.log").read_text() and "r=2" in (sweep / "trial-1.log").read_text()
    # A sweep's folder that is a link is refused: a resume writes and removes trial files there.
    moved = d / "moved-sweep"
    sweep.rename(moved)
    sweep.symlink_to(moved)
    doc = json.loads((moved / "sweep.json").read_text())
    doc["trials"][0]["state"] = "pending"  # would be run again, its trial-0.run removed
    (moved / "sweep.json").write_text(json.dumps(doc))
    before = sorted(p.name for p in moved.iterdir())
    r = ml("sweep", "--resume", sweep.name)
    assert r.returncode == 2 and "not a link" in r.stderr, r.stderr
    assert sorted(p.name for p in moved.iterdir()) == before
    sweep.unlink()
    (d / "ok.toml").write_text('[run]\ncommand = "echo {x}"\n[sweep.grid]\nx = [1, 2]\n')
    r = ml("validate", "ok.toml")
    assert r.returncode == 0 and "sweep: 2 trials, at most 1 at once (mltrain sweep ok.toml)" in r.stdout, r.stdout
    r = ml("run", d / "ok.toml")
    assert r.returncode == 2 and "has [sweep]" in r.stderr and "mltrain sweep" in r.stderr, r.stderr
    r = ml("sweep", "--resume", "nothing-like-it")
    assert r.returncode == 2 and "no sweep matches 'nothing-like-it'" in r.stderr, r.stderr
    # A sweep id is a name in the state folder, never a path out of it (its trials' files are written there).
    outside = ml.dir / "elsewhere"
    outside.mkdir()
    (outside / "sweep.json").write_text(json.dumps({"schema": 1, "id": "x", "name": "x", "spec_file": str(d / "ok.toml"),
                                                    "trials": [{"trial": 0, "params": {"x": "1"}, "state": "pending"}]}))
    (ml.home / "sweeps").mkdir(parents=True, exist_ok=True)
    r = ml("sweep", "--resume", os.path.relpath(outside, ml.home / "sweeps"))
    assert r.returncode == 2 and "no sweep matches" in r.stderr, r.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["sweep.json"]


def test_random_draws_are_seeded_and_in_range_and_a_list_runs_as_written(ml):
    d = ml.dir
    (d / "rand.toml").write_text(
        '[run]\ncommand = "echo lr={lr} layers={layers} opt={opt}"\n[sweep]\nmax_parallel = 3\ntrials = 4\nseed = 7\n'
        '[sweep.grid]\nopt = ["sgd", "adam"]\n'
        '[sweep.random]\nlr = { min = 1e-4, max = 1e-1, log = true }\nlayers = { min = 2, max = 8, int = true }\n')
    drawn = []
    for _ in range(2):
        r = ml("sweep", d / "rand.toml", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        (latest,) = [p for p in sorted((ml.home / "sweeps").iterdir()) if p.name not in {x[0] for x in drawn}][-1:]
        trials = json.loads((latest / "sweep.json").read_text())["trials"]
        drawn.append((latest.name, [t["params"] for t in trials]))
    assert drawn[0][1] == drawn[1][1]  # the same seed draws the same trials
    params = drawn[0][1]
    assert [p["opt"] for p in params] == ["sgd"] * 4 + ["adam"] * 4
    assert all(1e-4 <= float(p["lr"]) <= 1e-1 and p["layers"] in {str(i) for i in range(2, 9)} for p in params)
    assert len({p["lr"] for p in params}) == 8
    # Each trial ran its own command, its parameters substituted.
    logs = {t: (ml.home / "sweeps" / drawn[0][0] / f"trial-{t}.log").read_text() for t in range(8)}
    for t, p in enumerate(params):
        assert f"lr={p['lr']} layers={p['layers']} opt={p['opt']}" in logs[t], logs[t]

    (d / "list.toml").write_text('[run]\ncommand = "echo {a}-{b}"\n[[sweep.list]]\na = "x"\nb = 1\n'
                                 '[[sweep.list]]\na = "y"\nb = 2.5\n')
    r = ml("sweep", d / "list.toml", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    latest = max((ml.home / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime)
    assert [t["params"] for t in json.loads((latest / "sweep.json").read_text())["trials"]] == [
        {"a": "x", "b": "1"}, {"a": "y", "b": "2.5"}]
    assert "x-1" in (latest / "trial-0.log").read_text() and "y-2.5" in (latest / "trial-1.log").read_text()


def test_a_sweep_being_run_cannot_be_resumed_twice(ml):
    p = start_sweep(ml, slow_sweep(ml))
    try:
        wait_two_running(ml)
        r = ml("sweep", "--resume", "latest")
        assert r.returncode == 2 and "is being run by another mltrain sweep" in r.stderr, r.stderr
    finally:
        (ml.dir / "go").touch()
        os.killpg(p.pid, signal.SIGINT)
        p.communicate(timeout=60)


def test_integer_draws_stay_within_the_range(ml):
    """An integer parameter is drawn from the integers in [min, max]: 0.01 to 1.99 holds only 1
    (rounding drew 0 and 2 before, with this seed too)."""
    spec = ml.dir / "ints.toml"
    spec.write_text('[run]\ncommand = "echo n={n}"\n[sweep]\ntrials = 8\nmax_parallel = 8\nseed = 1\n'
                    '[sweep.random]\nn = { min = 0.01, max = 1.99, int = true }\n')
    r = ml("sweep", spec, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [t["params"]["n"] for t in sweep_doc(ml)["trials"]] == ["1"] * 8


def slow_sweep(ml, seconds=None):
    """4 trials, 2 at a time, of `sleep` or, with no seconds, of waiting for the file `go` in ml.dir
    (a test that needs trials running until it says so cannot race a busy machine's clock)."""
    spec = ml.dir / "slow.toml"
    wait = f"sleep {seconds}" if seconds else f"until [ -e {ml.dir / 'go'} ]; do sleep 0.1; done"
    spec.write_text(f'name = "slow"\n[run]\ncommand = "{wait}; echo trial {{k}} done"\n'
                    '[sweep]\nmax_parallel = 2\n[sweep.grid]\nk = [0, 1, 2, 3]\n')
    return spec


def start_sweep(ml, spec):
    return subprocess.Popen([ml.bin, "sweep", str(spec)], env=ml._env(), cwd=str(ml.dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def run_id(sweep_dir, n):
    """Trial n's run id, once its launcher wrote it whole ("" before)."""
    try:
        return (sweep_dir / f"trial-{n}.run").read_text().strip()
    except FileNotFoundError:
        return ""


def wait_two_running(ml):
    """(the sweep's folder, the 2 trials running) once both runs wrote their ids."""
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            sweep_dir = next((ml.home / "sweeps").iterdir())
            running = [t["trial"] for t in sweep_doc(ml)["trials"] if t["state"] == "running"]
        except (ValueError, FileNotFoundError, StopIteration):  # not written yet
            running = []
        if len(running) == 2 and all(run_id(sweep_dir, n) for n in running):
            return sweep_dir, running
        time.sleep(0.05)
    raise AssertionError("two trials never ran")


def test_a_killed_sweep_is_resumed_without_running_a_trial_twice(ml):
    spec = slow_sweep(ml)
    p = start_sweep(ml, spec)
    sweep_dir, running = wait_two_running(ml)
    orphans = {n: run_id(sweep_dir, n) for n in running}
    p.kill()  # SIGKILL: the sweep says nothing; its trials' runs go on
    p.communicate(timeout=30)
    r = ml("sweep", "--resume", "latest", timeout=60)
    assert r.returncode == 2 and "still running, left by the mltrain sweep that was killed" in r.stderr, r.stderr
    assert all(f"trial {n} (run {orphans[n]})" in r.stderr for n in running), r.stderr
    (ml.dir / "go").touch()
    deadline = time.time() + 60
    while {x["status"] for x in records(ml)} != {"succeeded"}:
        assert time.time() < deadline, records(ml)
        time.sleep(0.1)
    # A spec broken meanwhile is refused before any trial, which keeps its state.
    good = spec.read_text()
    before = sweep_doc(ml)
    spec.write_text(good + "garbage = = 1\n")
    r = ml("sweep", "--resume", "latest", timeout=60)
    assert r.returncode == 2 and "slow.toml:" in r.stderr, r.stderr
    assert sweep_doc(ml) == before
    # So is one that no longer uses a parameter: the remaining trials would all run alike.
    spec.write_text(good.replace("{k}", "k"))
    r = ml("sweep", "--resume", "latest", timeout=60)
    assert r.returncode == 2 and "parameter k appears nowhere in [run]" in r.stderr, r.stderr
    assert sweep_doc(ml) == before
    spec.write_text(good)
    r = ml("sweep", "--resume", "latest", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    trials = sweep_doc(ml)["trials"]
    assert [t["state"] for t in trials] == ["succeeded"] * 4, trials
    assert all(trials[n]["run"] == orphans[n] for n in running), (trials, orphans)  # kept, not run again
    assert sorted(x["sweep"]["trial"] for x in records(ml)) == [0, 1, 2, 3]


def test_a_closed_terminal_stops_the_sweep_as_ctrl_c_does(ml):
    p = start_sweep(ml, slow_sweep(ml, 30))
    wait_two_running(ml)
    p.send_signal(signal.SIGHUP)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert "go on with: mltrain sweep --resume" in err
    states = [t["state"] for t in sweep_doc(ml)["trials"]]
    assert states.count("interrupted") == 2 and states.count("pending") == 2, states


def loss_sweep(ml, command, grid, reported="loss"):
    """A sweep ranked by `loss` whose trials run `command`; a [metrics] pattern reads what they
    print as `step N <reported>=V`."""
    spec = ml.dir / "loss.toml"
    spec.write_text(f'[run]\ncommand = "{command}"\n'
                    f'[metrics]\npattern = \'step (?P<step>\\d+) {reported}=(?P<{reported}>[0-9.]+)\'\n'
                    f'[sweep]\nmetric = "loss"\n[sweep.grid]\n{grid}\n')
    r = ml("sweep", spec, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_a_failed_trial_is_never_marked_best(ml):
    """Both trials report loss 0.5; the one that failed is not the best (it was marked `*` too)."""
    r = loss_sweep(ml, "echo step 1 loss=0.5; exit {code}", "code = [0, 1]")
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line[:1].isdigit()}
    assert "0.5 *" in rows["0"] and "succeeded" in rows["0"], r.stdout
    assert "*" not in rows["1"] and "failed" in rows["1"], r.stdout
    assert "best: trial 0 (code=0): loss 0.5" in r.stdout, r.stdout


def test_a_metric_no_trial_reports_is_said(ml):
    """The ranks report `los`, the sweep ranks by `loss`: said at the end, not only a column of `-`."""
    r = loss_sweep(ml, "echo step 1 los=0.5 {x}", "x = [1, 2]", reported="los")
    assert "no trial reported loss (rank 0's), so the trials are not ranked by it" in r.stderr, r.stderr
    # Reported, it is not said.
    r = loss_sweep(ml, "echo step 1 loss=0.5 {x}", "x = [1, 2]")
    assert "no trial reported" not in r.stderr, r.stdout + r.stderr
    assert "best: trial 0 (x=1): loss 0.5" in r.stdout, r.stdout


def test_a_value_is_one_shell_word_in_the_command_and_raw_only_when_asked(ml):
    d = ml.dir
    hit = d / "touched"
    (d / "quote.toml").write_text(
        f'[run]\ncommand = "printf \'<%s>\\\\n\' {{v}}; echo raw={{n!raw}}"\n'
        f'[run.env]\nV = "{{v}}"\n'
        f'[[sweep.list]]\nv = "0.1; touch {hit}"\nn = "$((2+3))"\n'
        f'[[sweep.list]]\nv = "a b \'c\'"\nn = "7"\n')
    r = ml("sweep", d / "quote.toml", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not hit.exists()  # the value ran as a command before
    latest = max((ml.home / "sweeps").iterdir(), key=lambda p: p.stat().st_mtime)
    t0, t1 = ((latest / f"trial-{t}.log").read_text() for t in (0, 1))
    assert f"<0.1; touch {hit}>" in t0 and "raw=5" in t0, t0
    assert "<a b 'c'>" in t1 and "raw=7" in t1, t1


WARM_UP_TRIAL = r'''
import os, sys, time
f = os.fdopen(3, "w", buffering=1)
bad = sys.argv[1] == "bad"
for step in range(40):
    f.write('{"step": %d, "loss": %s}\n' % (step, 100 if bad else 1.0))
    time.sleep(0.3 if bad else 0.01)
'''


def test_median_stopping_waits_for_a_tenth_of_the_longest_trial_by_default(ml):
    # It stopped trials at step 2 of 40: Optuna's n_warmup_steps is the default here, a tenth of
    # the longest finished trial's steps (39: step 4).
    d = ml.dir
    (d / "trial.py").write_text(WARM_UP_TRIAL)
    (d / "warm.toml").write_text(
        f'[run]\ncommand = "/usr/bin/python3 {d / "trial.py"} {{kind}}"\n'
        '[sweep]\nmetric = "loss"\nearly_stop = "median"\nmax_parallel = 1\n'
        '[[sweep.list]]\nkind = "good"\n[[sweep.list]]\nkind = "good"\n[[sweep.list]]\nkind = "bad"\n')
    r = ml("sweep", d / "warm.toml", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    trials = sweep_doc(ml)["trials"]
    assert [t["state"] for t in trials] == ["succeeded", "succeeded", "early-stopped"], trials
    assert 4 <= trials[2]["step"] < 39, trials[2]


def test_random_values_are_drawn_to_four_significant_digits(ml):
    d = ml.dir
    (d / "digits.toml").write_text(
        '[run]\ncommand = "echo lr={lr}"\n[sweep]\nmax_parallel = 4\ntrials = 6\nseed = 3\n'
        '[sweep.random]\nlr = { min = 1e-4, max = 1e-1, log = true }\nm = { min = 0.9, max = 0.99 }\n'
        '[run.env]\nM = "{m}"\n')
    r = ml("sweep", d / "digits.toml", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for t in sweep_doc(ml)["trials"]:
        for v in t["params"].values():  # 0.0032745629120937 was printed and run
            digits = v.lstrip("0.").replace(".", "").split("e")[0]
            assert len(digits) <= 4, t["params"]
        assert 1e-4 <= float(t["params"]["lr"]) <= 1e-1 and 0.9 <= float(t["params"]["m"]) <= 0.99
