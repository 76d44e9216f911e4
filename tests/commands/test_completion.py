"""`oomguard completion bash|zsh`: scripts generated from the parser, loaded by real shells."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oomguard.cli import COMMANDS, build_parser
from tests.conftest import REPO, run_oomguard

BASH = shutil.which("bash")
ZSH = shutil.which("zsh")
# The script as a user loads it: `source <(oomguard completion bash)`, oomguard from this checkout.
SOURCE_BASH = f"source <(PYTHONPATH={REPO / 'src'} {sys.executable} -m oomguard completion bash)"


def script(shell: str) -> str:
    proc = run_oomguard("completion", shell)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


def check_options() -> list[str]:
    """Every option string of `check`, read from argparse's own parser."""
    parser = build_parser(full=True)
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [s for a in subparsers.choices["check"]._actions for s in a.option_strings]


def test_every_command_and_every_check_option_is_in_the_bash_script() -> None:
    text = script("bash")
    top = next(line for line in text.splitlines() if line.startswith('    "")'))
    assert set(COMMANDS) | {"--help", "--version"} <= set(top.replace('"', " ").split())
    for name in COMMANDS:
        assert f"\n    {name})\n" in text, name
    check_arm = text.split("\n    check)\n", 1)[1].split("\n    plan)\n", 1)[0]
    offered = next(line for line in check_arm.splitlines() if line.strip().startswith("*)"))
    options = check_options()
    assert {"--json", "--budget", "--margin", "--root", "--require", "--no-gpu", "--probe-pinned"} <= set(options)
    assert sorted(options) == sorted(offered.split('"')[1].split())


def test_every_command_and_every_check_option_is_in_the_zsh_script() -> None:
    text = script("zsh")
    assert text.startswith("#compdef oomguard\n")
    for name in COMMANDS:
        assert f"_oomguard_{name}() {{" in text and f"'{name}:{COMMANDS[name]}'" in text.replace("'\\''", "'"), name
    body = text.split("_oomguard_check() {", 1)[1].split("\n}\n", 1)[0]
    specs = {line.strip().split("[")[0].strip("'").rstrip("=") for line in body.splitlines() if "[" in line}
    assert specs == set(check_options())


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_bash_accepts_and_registers_it(tmp_path: Path) -> None:
    path = tmp_path / "oomguard.bash"
    path.write_text(script("bash"))
    syntax = subprocess.run([str(BASH), "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr
    proc = subprocess.run(
        [str(BASH), "-c", f"{SOURCE_BASH}; complete -p oomguard"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "complete -o default -F _oomguard oomguard"


def complete_bash(line: str) -> list[str]:
    """What TAB offers at the end of *line* (words split as bash splits them, ``=`` included)."""
    words = line.replace("=", " = ").split() + ([""] if line.endswith(" ") else [])
    quoted = " ".join(f"'{w}'" for w in words)
    show = 'printf "%s\\n" "${COMPREPLY[@]}"'
    code = f"{SOURCE_BASH}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _oomguard; {show}"
    proc = subprocess.run([str(BASH), "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return sorted(w for w in proc.stdout.splitlines() if w)


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize(
    ("line", "offered"),
    [
        ("oomguard ch", ["check"]),
        ("oomguard c", ["capture", "check", "completion"]),
        ("oomguard --v", ["--version"]),
        ("oomguard check --bu", ["--budget"]),
        ("oomguard check --json --pro", ["--probe-mlock", "--probe-pinned"]),
        ("oomguard plan --per-job 1G --max", ["--max-jobs"]),
        ("oomguard run --restart ", ["always", "never", "on-failure"]),
        ("oomguard run --restart=n", ["never"]),
        ("oomguard run --on-oom ", ["concurrency", "margin"]),
        ("oomguard run --budget 1G --is", ["--isolate"]),
        ("oomguard completion ", ["bash", "zsh"]),
        ("oomguard check --budget ", []),  # free text: nothing to offer
        ("oomguard run --budget 1G -- --bu", []),  # the worker's own words, not oomguard's options
        ("oomguard run --budget 1G sh --bu", []),
    ],
)
def test_bash_completes(line: str, offered: list[str]) -> None:
    assert complete_bash(line) == offered


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_bash_completes_the_worker_command_and_files(tmp_path: Path) -> None:
    (tmp_path / "snapshot.tar.gz").write_text("")
    assert "bash" in complete_bash("oomguard run --restart never -- bas")  # commands on PATH
    assert complete_bash(f"oomguard check --root {tmp_path}/sn") == [f"{tmp_path}/snapshot.tar.gz"]
    assert complete_bash(f"oomguard capture {tmp_path}/sn") == [f"{tmp_path}/snapshot.tar.gz"]


@pytest.mark.skipif(ZSH is None, reason="zsh is not installed")
def test_zsh_accepts_and_registers_it(tmp_path: Path) -> None:
    path = tmp_path / "_oomguard"
    path.write_text(script("zsh"))
    syntax = subprocess.run([str(ZSH), "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert syntax.returncode == 0, syntax.stderr
    code = f"autoload -Uz compinit && compinit -u -D; source {path}; print -r -- $_comps[oomguard]"
    proc = subprocess.run([str(ZSH), "-f", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "_oomguard", proc.stdout + proc.stderr


@pytest.mark.skipif(ZSH is None, reason="zsh is not installed")
def test_zsh_offers_the_choices_of_an_option(tmp_path: Path) -> None:
    """An interactive zsh in a pseudo-terminal (zpty): TAB after `run --restart ` lists the modes."""
    path = tmp_path / "_oomguard"
    path.write_text(script("zsh"))
    driver = f"""
zmodload zsh/zpty
zpty -b z 'zsh -f -i'
zpty -w z 'PS1="> "; autoload -Uz compinit; compinit -u -D; source {path}'
zpty -w -n z $'oomguard run --restart \\t\\t'
zpty -r z out '*on-failure*'
print -r -- "$out"
zpty -d z
"""
    proc = subprocess.run([str(ZSH), "-f", "-c", driver], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "always" in proc.stdout and "never" in proc.stdout and "on-failure" in proc.stdout
