"""Shell completion scripts: `mltrain completions bash|zsh|fish` prints them, and they complete.

Run: /usr/bin/python3 -m pytest tests/e2e/test_completions.py
The binary is $MLTRAIN_BIN (default <repo>/build/mltrain); it embeds completions/* at build time,
so rebuild it (cmake --build build --target mltrain) after editing a script.
A shell that is not installed skips its tests (apt-get install bash-completion zsh fish).
"""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("MLTRAIN_BIN", REPO / "build" / "mltrain"))
SCRIPTS = {"bash": "mltrain.bash", "zsh": "_mltrain", "fish": "mltrain.fish"}
RUN_IDS = ["20261129-101010-hello-ab12", "20261129-111111-job-cd34"]


def commands():
    """The subcommands the binary has, from its --help: the scripts must offer every one."""
    import re
    out = subprocess.run([str(BIN), "--help"], capture_output=True, text=True, timeout=10).stdout
    section = out.split("Subcommands:", 1)[1].split("\n\n", 1)[0]
    return sorted(re.findall(r"^  (\S+)\s", section, re.M))


def need_shell(name):
    path = shutil.which(name)
    if not path:
        pytest.skip(f"{name} is not installed (apt-get install {name})")
    return path


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """The scripts as the binary prints them, written to files."""
    if not BIN.is_file():
        pytest.skip(f"no mltrain binary at {BIN} (build it, or set MLTRAIN_BIN)")
    out = tmp_path_factory.mktemp("scripts")
    paths = {}
    for shell, name in SCRIPTS.items():
        r = subprocess.run([str(BIN), "completions", shell], capture_output=True, timeout=10)
        assert r.returncode == 0, r.stderr.decode()
        (out / name).write_bytes(r.stdout)
        paths[shell] = out / name
    return paths


@pytest.fixture
def env(tmp_path):
    """A clean environment: a fake MLTRAIN_HOME with two runs, a user profile, a work folder."""
    home = tmp_path / "state"
    for run_id in RUN_IDS:
        (home / "runs" / run_id).mkdir(parents=True)
    (home / "runs" / "not-a-run.txt").write_text("")  # a file, not a run folder
    profiles = tmp_path / "config" / "mltrain" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "mine.toml").write_text("")
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "job.toml").write_text("")
    (work / "notes.txt").write_text("")
    e = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "MLTRAIN_HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }
    return e, work


@pytest.mark.parametrize("shell", sorted(SCRIPTS))
def test_printed_script_is_the_file(shell, scripts):
    assert scripts[shell].read_bytes() == (REPO / "completions" / SCRIPTS[shell]).read_bytes(), (
        f"`mltrain completions {shell}` differs from completions/{SCRIPTS[shell]}: rebuild the binary"
    )


def test_unknown_shell_is_an_error():
    if not BIN.is_file():
        pytest.skip(f"no mltrain binary at {BIN}")
    r = subprocess.run([str(BIN), "completions", "tcsh"], capture_output=True, text=True, timeout=10)
    assert r.returncode != 0 and "tcsh" in r.stderr


# ---- bash ---------------------------------------------------------------------------------------

BASH_HELPER = r"""
comp() {
    local line=$1
    COMP_LINE=$line
    COMP_POINT=${#line}
    read -ra COMP_WORDS <<<"$line"
    [[ $line == *' ' ]] && COMP_WORDS+=('')
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMPREPLY=()
    _mltrain mltrain "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}" 2>/dev/null
    printf '%s\n' "${COMPREPLY[@]}" | sort -u | tr '\n' ' '
    echo
}
"""


def bash_complete(script, env, cwd, lines, preamble=""):
    """COMPREPLY (sorted, de-duplicated) for each command line, completing at its end."""
    bash = need_shell("bash")
    body = preamble + f"source {shlex.quote(str(script))}\n" + BASH_HELPER
    body += "".join(f"comp {shlex.quote(line)}\n" for line in lines)
    r = subprocess.run([bash, "--norc", "--noprofile", "-c", body], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert len(out) == len(lines), r.stdout + r.stderr
    return {line: out[i].split() for i, line in enumerate(lines)}


def test_bash_registers(scripts, env):
    bash = need_shell("bash")
    e, work = env
    r = subprocess.run([bash, "--norc", "--noprofile", "-c", f"source <({shlex.quote(str(BIN))} completions bash) && complete -p mltrain"],
                       env=e, cwd=work, capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:1] == ["complete"]
    assert "-F _mltrain" in r.stdout and r.stdout.split()[-1] == "mltrain", r.stdout


def test_bash_completes(scripts, env):
    e, work = env
    got = bash_complete(scripts["bash"], e, work, [
        "mltrain r",
        "mltrain ",
        "mltrain run --ma",
        "mltrain completions ",
        "mltrain logs ",
        "mltrain logs -t 5 2026",
        "mltrain show --json ",
        "mltrain stop 20261129-1 ",
        "mltrain run --color ",
        "mltrain --color al",
        "mltrain run ",
        "mltrain run job.toml ",
        "mltrain validate --workdir ",
        "mltrain run --hostfile ",
        "mltrain run --profile ",
        "mltrain run --profile m",
        "mltrain -",
        "mltrain ls -",
    ])
    assert got["mltrain r"] == ["rerun", "rm", "run"]
    assert got["mltrain "] == commands()
    assert got["mltrain run --ma"] == ["--master-port", "--max-restarts"]
    assert got["mltrain completions "] == ["bash", "fish", "zsh"]
    assert got["mltrain logs "] == sorted(RUN_IDS + ["latest"])
    assert got["mltrain logs -t 5 2026"] == RUN_IDS
    assert got["mltrain show --json "] == sorted(RUN_IDS + ["latest"])
    assert got["mltrain stop 20261129-1 "] == []  # one run id at most
    assert got["mltrain run --color "] == ["always", "auto", "never"]
    assert got["mltrain --color al"] == ["always"]
    assert got["mltrain run "] == ["job.toml", "sub"]
    assert got["mltrain run job.toml "] == []
    assert got["mltrain validate --workdir "] == ["sub"]
    assert got["mltrain run --hostfile "] == ["job.toml", "notes.txt", "sub"]
    assert got["mltrain run --profile "] == ["cpu-cluster", "local", "mine", "nccl-ethernet"]
    assert got["mltrain run --profile m"] == ["mine"]
    assert {"--help", "--version", "--verbose", "--color"} <= set(got["mltrain -"])
    assert set(got["mltrain ls -"]) == {"-h", "--help", "--json", "--jsonl", "--where", "--columns", "-n", "--newest", "-v", "--verbose",
                                        "--color"}


def test_bash_default_run_home(scripts, env):
    """Without MLTRAIN_HOME, run ids come from $XDG_STATE_HOME/mltrain/runs."""
    e, work = env
    e = dict(e)
    e.pop("MLTRAIN_HOME")
    state = Path(e["HOME"]) / "xdg-state"
    (state / "mltrain" / "runs" / "20261130-000000-x-0001").mkdir(parents=True)
    e["XDG_STATE_HOME"] = str(state)
    got = bash_complete(scripts["bash"], e, work, ["mltrain logs "])
    assert got["mltrain logs "] == ["20261130-000000-x-0001", "latest"]


def test_bash_after_dashdash(scripts, env):
    """After '--' the command to run: commands first, then its arguments (files by default)."""
    e, work = env
    (work / "bin").mkdir()
    tool = work / "bin" / "mltrain-test-tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    e = dict(e, PATH=f"{work / 'bin'}:{e['PATH']}")
    got = bash_complete(scripts["bash"], e, work, ["mltrain run -n 2 -- mltrain-test-t", "mltrain run -n 2 -- cat no"])
    assert got["mltrain run -n 2 -- mltrain-test-t"] == ["mltrain-test-tool"]
    assert got["mltrain run -n 2 -- cat no"] == ["notes.txt"]


def test_bash_with_bash_completion(scripts, env):
    """The same answers when the bash-completion package is loaded."""
    main = Path("/usr/share/bash-completion/bash_completion")
    if not main.is_file():
        pytest.skip("bash-completion is not installed (apt-get install bash-completion)")
    e, work = env
    got = bash_complete(scripts["bash"], e, work, ["mltrain r", "mltrain logs ", "mltrain run -n 2 -- cat no"],
                        preamble=f"source {main}\n")
    assert got["mltrain r"] == ["rerun", "rm", "run"]
    assert got["mltrain logs "] == sorted(RUN_IDS + ["latest"])
    assert got["mltrain run -n 2 -- cat no"] == ["notes.txt"]


# ---- zsh ----------------------------------------------------------------------------------------

def test_zsh_syntax(scripts):
    zsh = need_shell("zsh")
    r = subprocess.run([zsh, "-n", str(scripts["zsh"])], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert scripts["zsh"].read_text().startswith("#compdef mltrain\n")


# Runs in `zsh -f` with $1 = a folder holding _mltrain, $2 = a compdump path, then command lines.
# compinit once (it takes seconds), check that it found _mltrain; then drive an interactive zsh on
# a pseudo-terminal (zpty): type each line and TAB, with compadd wrapped to print what it adds.
# Last, source the script as `source <(mltrain completions zsh)` would: it must register itself.
ZSH_HARNESS = r"""
zmodload zsh/zpty || exit 3
local dir=$1 dump=$2 line out
shift 2
fpath=($dir $fpath)
autoload -Uz compinit && compinit -u -d $dump
print -r -- "autoload: compdef=$_comps[mltrain]"
autoload -Uz +X _mltrain && (( $+functions[_mltrain] )) && print -r -- "autoload: defined"

zpty z zsh -f -i
# The prompt marks zle waiting for a line, the terminal in raw mode: a line typed before it would
# meet the terminal's own line editing, where ^U erases it before zle ever sees the tab.
zpty -w z "PROMPT='<z''le>'; RPROMPT=''; fpath=($dir \$fpath); autoload -Uz compinit; compinit -C -d $dump"
zpty -w z 'compadd () { local -a __hits; builtin compadd -O __hits "$@"; (( $#__hits )) && print -rl -- "" "<""hits>${(j: :)__hits}</""hits>"; builtin compadd "$@" }'
zpty -w z 'zstyle ":completion:*" menu no; bindkey "^I" complete-word; bindkey "^U" kill-whole-line'
zpty -w z "print -r -- '<ready>' \$((6*7))"
zpty -r z out '*<ready> 42*' || exit 4
zpty -r z out '*<zle>' || exit 4
for line in "$@"; do
  zpty -w z "$line"$'\t'$'\x15'"print -r -- '<line>' \$((6*7)) '</line>'"
  zpty -r z out '*<line> 42 </line>*' || exit 5
  print -r -- "<case>$line</case>"
  print -r -- "$out" | tr -d '\r' | grep -ao '<hits>.*</hits>'
  zpty -r z rest '*<zle>' || exit 6
done
zpty -d z

unset '_comps[mltrain]'
unfunction _mltrain
source $dir/_mltrain
print -r -- "source: compdef=$_comps[mltrain]"
(( $+functions[_mltrain] )) && print -r -- "source: defined"
"""


def test_zsh_loads_and_completes(scripts, env, tmp_path):
    zsh = need_shell("zsh")
    e, work = env
    zdot = tmp_path / "zdotdir"  # a clean ZDOTDIR: no user .zshrc gets in the way
    zdot.mkdir()
    fpath = tmp_path / "zfunc"
    fpath.mkdir()
    shutil.copy(scripts["zsh"], fpath / "_mltrain")
    e = dict(e, ZDOTDIR=str(zdot))
    lines = [
        "mltrain r",
        "mltrain run --max",
        "mltrain completions ",
        "mltrain logs ",
        "mltrain run --color ",
        "mltrain run --profile ",
        "mltrain run -n 2 -- cat no",
    ]
    harness = tmp_path / "harness.zsh"
    harness.write_text(ZSH_HARNESS)
    r = subprocess.run([zsh, "-f", str(harness), str(fpath), str(tmp_path / "zcompdump"), *lines],
                       env=e, cwd=work, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"rc {r.returncode}\n{r.stdout}{r.stderr}"
    out = r.stdout.splitlines()
    assert out[:2] == ["autoload: compdef=_mltrain", "autoload: defined"], r.stdout + r.stderr
    assert out[-2:] == ["source: compdef=_mltrain", "source: defined"], r.stdout + r.stderr
    assert r.stderr == ""

    got, case = {}, None
    for o in out[2:-2]:
        if o.startswith("<case>"):
            case = o[len("<case>"):-len("</case>")]
            got[case] = set()
        elif o.startswith("<hits>"):
            got[case] |= set(o[len("<hits>"):-len("</hits>")].split())
    assert list(got) == lines, r.stdout
    assert got["mltrain r"] == {"rerun", "rm", "run"}
    assert got["mltrain run --max"] == {"--max-restarts"}
    assert got["mltrain completions "] == {"bash", "zsh", "fish"}
    assert got["mltrain logs "] == set(RUN_IDS) | {"latest"}
    assert got["mltrain run --color "] == {"auto", "always", "never"}
    assert {"local", "nccl-ethernet", "cpu-cluster", "mine"} <= got["mltrain run --profile "]
    assert got["mltrain run -n 2 -- cat no"] == {"notes.txt"}


# ---- fish ---------------------------------------------------------------------------------------

def fish_complete(script, env, cwd, lines):
    """The candidates (first field of each `complete -C` line) for each command line."""
    fish = need_shell("fish")
    sep = "--mltrain-test-separator--"
    body = f"source {shlex.quote(str(script))}\n"
    body += "".join(f"complete -C {shlex.quote(line)}; echo {sep}\n" for line in lines)
    r = subprocess.run([fish, "--no-config", "-c", body], env=env, cwd=cwd, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.split(sep + "\n")[:-1]
    assert len(blocks) == len(lines), r.stdout + r.stderr
    return {line: sorted({c.split("\t")[0] for c in blocks[i].splitlines()}) for i, line in enumerate(lines)}


def test_fish_syntax(scripts):
    fish = need_shell("fish")
    r = subprocess.run([fish, "--no-config", "-n", str(scripts["fish"])], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr


def test_fish_completes(scripts, env):
    e, work = env
    got = fish_complete(scripts["fish"], e, work, [
        "mltrain ",
        "mltrain run --max",
        "mltrain completions ",
        "mltrain logs ",
        "mltrain run --color ",
        "mltrain run ",
        "mltrain run --profile ",
        "mltrain run --name ls --dry",
        "mltrain run -n 2 -- cat no",
    ])
    assert got["mltrain "] == commands()
    assert got["mltrain run --max"] == ["--max-restarts"]
    assert got["mltrain completions "] == ["bash", "fish", "zsh"]
    assert got["mltrain logs "] == sorted(RUN_IDS + ["latest"])
    assert got["mltrain run --color "] == ["always", "auto", "never"]
    assert got["mltrain run "] == ["job.toml", "sub/"]
    assert got["mltrain run --profile "] == ["cpu-cluster", "local", "mine", "nccl-ethernet"]
    assert got["mltrain run --name ls --dry"] == ["--dry-run"]
    assert got["mltrain run -n 2 -- cat no"] == ["notes.txt"]
