"""The one launcher of oomguard's helper children: ``python -m oomguard.verify.<child> ARGS``.

``verify`` starts ``_alloc`` children (allocate, report, hold) and ``--probe-mlock`` /
``--probe-pinned`` start a ``_pin`` child (lock, report, exit). Each child speaks its own small
protocol (its module's docstring): arguments in, one JSON line on stdout, an exit status that
is the child's, never the CLI's. The child runs the same interpreter and finds oomguard where
this process found it (``PYTHONPATH`` from ``sys.path``: a checkout, a venv or ``oomguard.pyz``).
"""

from __future__ import annotations

import os
import subprocess
import sys

CHILDREN = ("_alloc", "_pin")


def child_argv(child: str, *args: str) -> list[str]:
    """The command line of *child* (one of ``CHILDREN``)."""
    if child not in CHILDREN:
        raise ValueError(f"no such oomguard child: {child!r}")
    return [sys.executable, "-m", f"oomguard.verify.{child}", *args]


def child_env() -> dict[str, str]:
    """This process's environment, with ``PYTHONPATH`` set so the child imports the same oomguard."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def start_child(child: str, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    """Start *child* with *args*; its stdout is a text pipe, its stderr is discarded."""
    return subprocess.Popen(
        child_argv(child, *args),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )
