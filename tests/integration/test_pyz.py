"""`make pyz`: dist/oomguard.pyz, the worker side as one file (standard library only, no manager/).

Built with the Makefile's own recipe into a temporary directory, then run with `python -I` from
another directory, so nothing of the checkout or of the virtual environment can leak in."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

THIRD_PARTY = ("fastapi", "sqlalchemy", "uvicorn", "alembic", "psycopg", "prometheus_client", "jinja2", "pydantic")


def _python() -> str:
    """The system's python3 where it is recent enough (what a worker image has), else this one."""
    system = "/usr/bin/python3"
    if os.access(system, os.X_OK):
        ok = subprocess.run([system, "-c", "import sys; sys.exit(sys.version_info < (3, 10))"], timeout=30)
        if ok.returncode == 0:
            return system
    return sys.executable


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed: `make pyz` cannot run")
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [make, "-s", "pyz", f"DIST={dist}", f"PY={sys.executable}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = dist / "oomguard.pyz"
    assert out.is_file() and not (dist / ".pyz-stage").exists(), "one file, no leftovers"
    return out


def run_pyz(pyz: Path, cwd: Path, *args: str, flags: tuple[str, ...] = ("-I",)) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OOMGUARD_", "PYTHON"))}
    return subprocess.run(
        [_python(), *flags, str(pyz), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_zip_holds_the_worker_side_only(pyz: Path) -> None:
    with zipfile.ZipFile(pyz) as z:
        names = z.namelist()
        main = z.read("__main__.py").decode()
        sources = {n: z.read(n).decode() for n in names if n.endswith(".py")}
    assert not [n for n in names if "/manager/" in n or n.endswith("/manager")], "no manager/ in the zip"
    assert "oomguard.cli" in main and "main" in main
    assert "oomguard/policy/profiles.json" in names and "oomguard/schema.json" in names
    # Every worker-side module of the checkout is in it.
    src = REPO / "src" / "oomguard"
    expected = {
        "oomguard/" + p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if "manager" not in p.relative_to(src).parts
    }
    assert expected <= set(sources), sorted(expected - set(sources))
    pattern = re.compile(rf"^\s*(?:import|from)\s+({'|'.join(THIRD_PARTY)})\b", re.M)
    for name, text in sources.items():
        assert not pattern.search(text), f"{name} imports {pattern.search(text)[1]}"  # type: ignore[index]
    with open(pyz, "rb") as f:
        assert f.readline() == b"#!/usr/bin/env python3\n", "runnable as a command"


def test_check_and_check_json(pyz: Path, tmp_path: Path) -> None:
    text = run_pyz(pyz, tmp_path, "check")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("oomguard check (live system)") and "effective limit" in text.stdout
    # -S too: no site-packages at all, so the standard library is all it has.
    proc = run_pyz(pyz, tmp_path, "check", "--json", flags=("-I", "-S"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["memory"]["effective_bytes"] > 0
    assert report["budget"]["bytes"] > 0 and report["budget"]["source"] == "auto"


def test_plan_with_a_builtin_profile(pyz: Path, tmp_path: Path) -> None:
    """The built-in profiles are package data read from inside the zip (profiles.py)."""
    proc = run_pyz(
        pyz, tmp_path, "plan", "--profile", "porep-c2-32g", "--budget", "300GiB", "--pinned-baseline", "0", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["shape"]["profile"] == "porep-c2-32g"
    assert plan["shape"]["per_job_bytes"] == 14 * 2**30 and plan["shape"]["baseline_bytes"] == 70 * 2**30
    assert plan["concurrency"] == 16  # (300 - 70) GiB / 14 GiB, under max_jobs 18
    listing = run_pyz(pyz, tmp_path, "plan", "--list-profiles")
    assert listing.returncode == 0 and "porep-c2-32g" in listing.stdout, listing.stderr
    missing = run_pyz(pyz, tmp_path, "plan", "--profile", "no-such-profile")
    assert missing.returncode == 2 and "no-such-profile" in missing.stderr


def test_capture_and_replay(pyz: Path, tmp_path: Path) -> None:
    snap = tmp_path / "node.tar.gz"
    proc = run_pyz(pyz, tmp_path, "capture", str(snap))
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(snap) as tar:
        assert any(n.endswith("proc/meminfo") for n in tar.getnames())
    live = json.loads(run_pyz(pyz, tmp_path, "check", "--json", "--no-gpu").stdout)
    replay = run_pyz(pyz, tmp_path, "check", "--json", "--root", str(snap))
    assert replay.returncode == 0, replay.stderr
    again = json.loads(replay.stdout)
    assert again["memory"]["effective_bytes"] == live["memory"]["effective_bytes"]
    assert again["memory"]["limited_by"] == live["memory"]["limited_by"]


def test_verify_children_import_from_the_zip(pyz: Path, tmp_path: Path) -> None:
    """verify starts `sys.executable -m oomguard.verify._alloc` children, which find oomguard in the zip."""
    proc = run_pyz(pyz, tmp_path, "verify", "--budget", "2GiB", "--fraction", "0.01", "--hold", "0.2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["delivered"] is True and result["oom_kills"] == 0
    assert result["touched_bytes"] == result["target_bytes"] == 2 * 2**30 // 100
    assert result["children"], "the children ran (python -m oomguard.verify._alloc, from the zip)"
    plain = run_pyz(pyz, tmp_path, "verify", "--budget", "2GiB", "--fraction", "0.01", "--hold", "0.2")
    assert plain.returncode == 0 and "DELIVERED" in plain.stdout, plain.stdout + plain.stderr


def test_run_passes_the_budget(pyz: Path, tmp_path: Path) -> None:
    proc = run_pyz(pyz, tmp_path, "run", "--restart", "never", "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert "start" in proc.stderr and "clean" in proc.stderr
    echo = run_pyz(
        pyz,
        tmp_path,
        "run",
        "--restart",
        "never",
        "--budget",
        "3GiB",
        "--",
        "sh",
        "-c",
        'echo "$1 $OOMGUARD_BUDGET_BYTES"',
        "sh",
        "{budget}",
    )
    assert echo.returncode == 0, echo.stderr
    assert echo.stdout.strip() == f"3GiB {3 * 2**30}"
    failing = run_pyz(pyz, tmp_path, "run", "--restart", "never", "--", "sh", "-c", "exit 7")
    assert failing.returncode == 7, failing.stderr


def test_manager_is_not_in_the_zip(pyz: Path, tmp_path: Path) -> None:
    proc = run_pyz(pyz, tmp_path, "manager", "--port", "1")
    assert proc.returncode == 2, "the manager cannot run from the worker zip"
    assert proc.stderr == (
        "oomguard: error: manager: not in this build (the worker zipapp): pip install 'oomguard[manager]'\n"
    )
    version = run_pyz(pyz, tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.startswith("oomguard "), version.stdout + version.stderr
