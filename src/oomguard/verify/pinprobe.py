"""``--probe-mlock SIZE`` and ``--probe-pinned SIZE``: really lock memory, in a short-lived child."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from oomguard.verify.launch import start_child

TIMEOUT = 60.0


def _failed(nbytes: int, error: str) -> dict[str, Any]:
    return {"bytes": nbytes, "ok": False, "errno": None, "skipped": None, "error": error, "charged": None}


def run_pin_probe(kind: str, nbytes: int) -> dict[str, Any]:
    """{"bytes", "ok", "errno", "error", "skipped", "charged"} from ``python -m oomguard.verify._pin KIND NBYTES``."""
    proc = start_child("_pin", kind, str(nbytes))
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return _failed(nbytes, f"the probe did not finish within {TIMEOUT:g} s")
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        died = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        result = _failed(nbytes, f"the probe child died ({died}) without a result")
    return result
