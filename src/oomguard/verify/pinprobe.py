"""``--probe-mlock SIZE`` and ``--probe-pinned SIZE``: really lock memory, in a short-lived child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

TIMEOUT = 60.0


def run_pin_probe(kind: str, nbytes: int) -> dict[str, Any]:
    """{"bytes", "ok", "errno", "error", "skipped"} from ``python -m oomguard.verify._pin KIND NBYTES``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "oomguard.verify._pin", kind, str(nbytes)],
            capture_output=True,
            check=False,
            text=True,
            env=env,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return {
            "bytes": nbytes,
            "ok": False,
            "errno": None,
            "skipped": None,
            "error": f"the probe did not finish within {TIMEOUT:g} s",
        }
    try:
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        died = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        result = {
            "bytes": nbytes,
            "ok": False,
            "errno": None,
            "skipped": None,
            "error": f"the probe child died ({died}) without a result",
        }
    return result
