"""The command line: output forms, exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from oomguard.cli import main
from tests.conftest import run_oomguard

pytestmark = pytest.mark.usefixtures("clean_env")


def make_tree(tmp: Path, limit: str = "536870912", env: str = "", mem_total_kb: int = 16318412) -> Path:
    """A minimal Docker-on-v2 tree (private cgroupns) with memory.max = *limit*."""
    files = {
        "proc/self/cgroup": "0::/\n",
        "proc/self/mountinfo": "1310 1301 0:27 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw,nsdelegate\n",
        "proc/meminfo": f"MemTotal:       {mem_total_kb} kB\nMemAvailable:   {mem_total_kb // 2} kB\n",
        "proc/self/environ": env,
        "proc/self/status": "Name:\tpython3\nCapEff:\t00000000a80425fb\nVmLck:\t       0 kB\n",
        "proc/self/limits": "Limit  Soft Limit  Hard Limit  Units\nMax locked memory  unlimited  unlimited  bytes\n",
        "sys/fs/cgroup/memory.max": limit + "\n",
        "sys/fs/cgroup/cgroup.controllers": "cpu memory pids\n",
        ".dockerenv": "",
    }
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return tmp


def test_check_json_is_one_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--json", "--root", str(make_tree(tmp_path))]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema_version"] == 1
    assert report["memory"]["effective_bytes"] == 536870912
    assert report["memory"]["limited_by"] == "cgroup-v2"
    # 512 MiB basis: margin = max(256 MiB, 10%) = 256 MiB
    assert report["budget"] == {
        "bytes": 268435456,
        "source": "auto",
        "basis_bytes": 536870912,
        "safety_margin_bytes": 268435456,
        "requested": "auto",
    }


def test_check_human_names_the_binding_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--root", str(make_tree(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "512 MiB" in out and "cgroup-v2 limit binds" in out
    assert "/sys/fs/cgroup/memory.max" in out
    assert "Warnings (0)" in out


@pytest.mark.parametrize(
    ("args", "env", "want_bytes", "want_source"),
    [
        (["--budget", "300MiB"], "", 300 * 2**20, "explicit"),
        (["--budget", "50%"], "", 256 * 2**20, "explicit"),
        ([], "OOMGUARD_BUDGET=100M\0", 100 * 2**20, "env"),
        (["--budget", "200M"], "OOMGUARD_BUDGET=100M\0", 200 * 2**20, "explicit"),  # flag beats env
        (["--budget", "auto"], "OOMGUARD_BUDGET=100M\0", 256 * 2**20, "auto"),
        (["--margin", "100MiB"], "", 412 * 2**20, "auto"),
        (["--margin", "25%"], "", 384 * 2**20, "auto"),
    ],
)
def test_budget_precedence(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    env: str,
    want_bytes: int,
    want_source: str,
) -> None:
    assert main(["check", "--json", "--root", str(make_tree(tmp_path, env=env)), *args]) == 0
    budget = json.loads(capsys.readouterr().out)["budget"]
    assert (budget["bytes"], budget["source"]) == (want_bytes, want_source)
    assert (budget["safety_margin_bytes"] is None) == (want_source != "auto")


def test_explicit_budget_above_limit_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--json", "--root", str(make_tree(tmp_path)), "--budget", "1GiB"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["budget"]["bytes"] == 2**30  # kept: the operator's override
    assert [w["code"] for w in report["warnings"]] == ["budget-exceeds-limit"]


def test_require(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(make_tree(tmp_path))
    assert main(["check", "--root", root, "--require", "256MiB"]) == 0
    assert main(["check", "--root", root, "--require", "257MiB"]) == 3
    assert "--require: budget 256 MiB is below the required 257 MiB" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["check", "--budget", "lots"], "", "oomguard: error: --budget: invalid size 'lots'"),
        (["check", "--margin", "5X"], "", "oomguard: error: --margin: invalid size '5X'"),
        (["check", "--require=-1"], "", "oomguard: error: --require: invalid size '-1'"),
        (["check"], "OOMGUARD_BUDGET=much\0", "oomguard: error: OOMGUARD_BUDGET: invalid size 'much'"),
        (["check", "--bogus"], "", "oomguard: error: check: unknown option --bogus"),
        (["check", "--budget"], "", "oomguard: error: check: --budget needs a value"),
        (["check", "extra"], "", "oomguard: error: check: unexpected argument 'extra'"),
        (["frobnicate"], "", "oomguard: error: unknown command 'frobnicate'"),
        (["check", "--probe-mlock", "1M"], "", "oomguard: error: check: --probe-mlock and --probe-pinned lock memory"),
    ],
)
def test_usage_errors_are_one_line_exit_2(tmp_path: Path, args: list[str], env: str, message: str) -> None:
    tree = make_tree(tmp_path, env=env)
    full = [*args, "--root", str(tree)] if args[0] == "check" else args
    proc = run_oomguard(*full)
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    assert proc.stderr.startswith(message), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("kind", ["missing", "corrupt", "empty-dir", "not-gzip"])
def test_bad_snapshot_exit_2(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "snap.tar.gz"
    if kind == "corrupt":
        target.write_bytes(b"\x1f\x8b\x08\x00garbage" * 10)
    elif kind == "empty-dir":
        target = tmp_path / "empty"
        target.mkdir()
    elif kind == "not-gzip":
        target.write_text("hello")
    proc = run_oomguard("check", "--root", str(target))
    assert proc.returncode == 2
    assert proc.stderr.startswith("oomguard: error: --root: ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_tarball_without_probe_files_is_not_a_snapshot(tmp_path: Path) -> None:
    target = tmp_path / "other.tar.gz"
    (tmp_path / "readme").write_text("hi")
    with tarfile.open(target, "w:gz") as tar:
        tar.add(tmp_path / "readme", "readme")
    proc = run_oomguard("check", "--root", str(target))
    assert proc.returncode == 2 and "is not a snapshot" in proc.stderr


def test_help_and_version() -> None:
    top = run_oomguard("--help")
    assert top.returncode == 0 and "check" in top.stdout and "exit codes" in top.stdout
    sub = run_oomguard("check", "--help")
    assert sub.returncode == 0 and "--require SIZE" in sub.stdout and "3   a threshold" in sub.stdout
    assert run_oomguard().returncode == 2
    version = run_oomguard("--version")
    assert version.returncode == 0 and version.stdout.startswith("oomguard 0.")


def test_live_check_exits_0_and_reports_a_ceiling() -> None:
    proc = run_oomguard("check", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    mem = report["memory"]
    assert mem["effective_bytes"] > 0
    assert mem["effective_bytes"] <= mem["host_total_bytes"]
    assert report["budget"]["bytes"] < mem["effective_bytes"]


def test_check_imports_only_the_core() -> None:
    """`check` must not load heavy modules: they cost start-up time (docs/architecture.md)."""
    code = (
        "import sys, runpy; sys.argv = ['oomguard', 'check', '--json']\n"
        "try:\n    runpy.run_module('oomguard', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = {'re', 'json', 'argparse', 'typing', 'dataclasses', 'enum', 'tarfile', 'subprocess'}\n"
        "sys.stderr.write(repr(sorted(heavy & set(sys.modules))))\n"
    )
    proc = run_oomguard_code(code)
    assert proc.stderr.strip() == "[]", proc.stderr


def run_oomguard_code(code: str):  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO / 'src')!r})\n" + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
