"""The command examples of README.md and docs/*.md that run on localhost, run as written.

Which blocks run: a fenced ```sh or ```console block whose opening fence comes right after the line

    <!-- example: runs on localhost -->

(an HTML comment: invisible on the rendered page). Blocks without it (hosts, GPUs, Slurm,
Kubernetes, interactive commands, the setup scripts) are not run; test_marked_blocks_exist keeps
the rule from silently matching nothing.

How a block runs: in a fresh folder holding `build/mltrain` (the binary under test, also first on
PATH as `mltrain`) and links to the repository's `examples/` and `python/`, with HOME in the
folder (so `~/.local/state/mltrain` is the test's own) and /usr/bin before the rest of PATH (the
system's python3, as the rest of the suite). An ```sh block runs as one `/bin/sh -e`
script and must exit 0. In a ```console block each `$ ` line is a command (`/bin/sh -c`, must
exit 0) and the
lines after it up to the next `$ ` are its output, stdout and stderr together: every shown line
must appear in what it printed. In a shown line `…` or `...` stands for any text, durations
(`1.0s`, `12ms`) match any duration, run ids (`20261129-141939-sh-3600`) any run id, `/home/alice` is the folder's HOME, and a line that is only `…` or `...` is skipped.

Run: MLTRAIN_BIN=$PWD/build/mltrain /usr/bin/python3 -m pytest tests/e2e/test_docs_examples.py -q -p no:cacheprovider
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- example: runs on localhost -->"
DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


def marked_blocks():
    """(file:line, language, text) of every marked block."""
    out = []
    for doc in DOCS:
        lines = doc.read_text().split("\n")
        for i, line in enumerate(lines):
            m = re.match(r"^```(\w*)\s*$", line)
            if not (m and i > 0 and lines[i - 1].strip() == MARKER):
                continue
            assert m.group(1) in ("sh", "console"), f"{doc.name}:{i + 1}: the marker is for sh or console blocks"
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            out.append((f"{doc.relative_to(REPO)}:{i + 1}", m.group(1), "\n".join(lines[i + 1:end])))
    return out


BLOCKS = marked_blocks()


def test_marked_blocks_exist():
    where = {b[0].split(":")[0] for b in BLOCKS}
    assert "README.md" in where and len(BLOCKS) >= 3, BLOCKS


def shown_line_pattern(line):
    """A regex for one shown output line: `…` any text, durations any duration."""
    parts = re.split(r"(…|\.\.\.|\d{8}-\d{6}-[\w.-]+|\d+(?:\.\d+)?(?:ms|s)\b)", line.strip())
    rx = ""
    for k, p in enumerate(parts):
        if k % 2 == 0:
            rx += re.escape(p)
        elif p in ("…", "..."):
            rx += ".*"
        elif re.fullmatch(r"\d{8}-\d{6}-[\w.-]+", p):
            rx += r"\d{8}-\d{6}-[\w.-]+"
        else:
            rx += r"\d+(?:\.\d+)?(?:ms|s)"
    return re.compile(rx)


def console_steps(text):
    """[(command, [shown output lines])] of a console block."""
    steps = []
    for line in text.split("\n"):
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and line.strip() and line.strip() not in ("…", "..."):
            steps[-1][1].append(line)
    return steps


@pytest.fixture
def sandbox(tmp_path, mltrain_bin):
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "mltrain").symlink_to(Path(mltrain_bin).resolve())
    for name in ("examples", "python"):
        (tmp_path / name).symlink_to(REPO / name)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MLTRAIN_") and k not in ("XDG_STATE_HOME", "XDG_CACHE_HOME")}
    # The system's python3, as the rest of the suite uses (/usr/bin/python3), before any other.
    env.update(HOME=str(home), PATH=f"{tmp_path / 'build'}:/usr/local/bin:/usr/bin:/bin:{env.get('PATH', '')}")
    return tmp_path, env


# A block may make a venv and pip-install the package: 5 s quiet, 80 s at load 17 on 2 cores.
def run_sh(script, cwd, env, timeout=240, errexit=True):
    return subprocess.run(["/bin/sh", "-ec" if errexit else "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout)


@pytest.mark.parametrize("where,lang,text", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_example_runs_as_written(sandbox, where, lang, text):
    cwd, env = sandbox
    if lang == "sh":
        r = run_sh(text, cwd, env)
        assert r.returncode == 0, f"{where}: the block exited {r.returncode}:\n{r.stdout[-3000:]}"
        return
    for command, shown in console_steps(text):
        r = run_sh(command, cwd, env, errexit=False)
        assert r.returncode == 0, f"{where}: `{command}` exited {r.returncode}:\n{r.stdout[-3000:]}"
        got = r.stdout.splitlines()
        for line in shown:
            rx = shown_line_pattern(line.replace("/home/alice", env["HOME"]))
            assert any(rx.fullmatch(g.strip()) for g in got), (
                f"{where}: `{command}` did not print the line the docs show:\n  {line}\n"
                f"it printed:\n{r.stdout[-3000:]}")


def test_the_rule_catches_a_broken_example(sandbox):
    """The checker itself: a changed output line and a failing command are caught."""
    cwd, env = sandbox
    (command, shown), = console_steps("$ build/mltrain run -n 2 -- sh -c 'echo rank $RANK'\n[0] rank 0\n")
    r = run_sh(command, cwd, env)
    assert r.returncode == 0, r.stdout
    assert any(shown_line_pattern(shown[0]).fullmatch(g.strip()) for g in r.stdout.splitlines())
    assert not any(shown_line_pattern("[0] rank zero").fullmatch(g.strip()) for g in r.stdout.splitlines())
    assert shown_line_pattern("done in 0.0s (logs: …)").fullmatch("done in 12.5s (logs: mltrain logs x)")
    assert run_sh("build/mltrain run --no-such-flag", cwd, env).returncode != 0
