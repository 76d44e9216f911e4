"""Hostile files in the spool: only regular files are read, within a cap, never blocking.

A FIFO named like an item used to hang the agent in ``open``; a symbolic link to ``/dev/zero`` was a
MemoryError traceback. Each such item now moves to ``rejected/`` (reason ``unreadable``) with one
line in the log, and the queue goes on: the real command (``oomguard agent --once``) against a real
HTTP server, and the sender in-process.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oomguard.agent import Sender, Spool
from oomguard.agent.rejected import read_retry
from oomguard.agent.spool import MAX_ITEM_BYTES, read_item
from tests.conftest import run_oomguard
from tests.helpers.agent_fake import TOKEN, FakeManager, Logs, put_reports, why_of

GOOD: dict[str, Any] = {"node": "n1", "id": "good", "report": {"memory": {}}, "interval_s": None}


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """*fn*'s result, failing (not hanging) when it takes longer than *seconds*: the old code blocked
    for ever in ``open`` on a FIFO, so this runs *fn* in a daemon thread."""
    result: list[Any] = []
    failed: list[BaseException] = []

    def call() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised below, in the test's thread
            failed.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (blocked on a FIFO?)"
    if failed:
        raise failed[0]
    return result[0]


def _hostile_spool(spool: Path) -> dict[str, str]:
    """Items that are not regular JSON files of a sane size, oldest first, then one good item; the
    words each one's reason must hold."""
    spool.mkdir(mode=0o700, exist_ok=True)
    os.mkfifo(spool / "000000000001-report.json")
    os.symlink("/dev/zero", spool / "000000000002-report.json")
    with open(spool / "000000000003-report.json", "wb") as f:
        f.truncate(MAX_ITEM_BYTES + 1)  # sparse: one byte over the cap
    (spool / "000000000004-event.json").mkdir()
    (spool / "000000000005-report.json").write_text("[" * 100_000 + "]" * 100_000)
    (spool / "000000000006-event.json").write_text('{"a": ' * 65 + "1" + "}" * 65)  # 65 levels: one too many
    (spool / "000000000007-report.json").write_text(json.dumps(GOOD))
    os.mkfifo(spool / "000000000007-report.json.retry")  # its 5xx counter: a FIFO too
    (spool / "rejected").mkdir()
    os.mkfifo(spool / "rejected" / "000000000001-report.json.why")  # where the first reason goes
    return {
        "000000000001-report.json": "not a regular file",
        "000000000002-report.json": "Too many levels of symbolic links",  # ELOOP: O_NOFOLLOW
        "000000000003-report.json": "larger than 4 MiB",
        "000000000004-event.json": "not a regular file",
        "000000000005-report.json": "nested more than 64 levels deep",
        "000000000006-event.json": "nested more than 64 levels deep",
    }


def _check_rejected(spool: Path, expected: dict[str, str]) -> None:
    rejected = spool / "rejected"
    for name, words in expected.items():
        assert not os.path.lexists(spool / name), name
        assert os.path.lexists(rejected / name), name
        why = why_of(rejected, name)
        assert why["reason"] == "unreadable" and words in why["why"], (name, why)


def test_the_sender_moves_hostile_items_aside_and_delivers_the_rest(manager: FakeManager, tmp_path: Path) -> None:
    expected = _hostile_spool(tmp_path)
    ids = put_reports(Spool(str(tmp_path)), 1)
    logs = Logs()  # asserts one line each, no traceback
    assert _within(20, Sender(manager.url, TOKEN, Spool(str(tmp_path)), log=logs).flush) is True
    assert manager.order == ["good", *ids]
    _check_rejected(tmp_path, expected)
    assert len(logs) == len(expected)
    assert all("will not be sent (unreadable spool file: " in line for line in logs)


def test_agent_once_with_a_hostile_spool_exits_0_in_one_line_each(manager: FakeManager, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    expected = _hostile_spool(spool)
    args = ("agent", "--once", "--manager", manager.url, "--spool", str(spool), "--node", "n1", "--no-gpu")
    started = time.monotonic()
    proc = run_oomguard(*args, env={"OOMGUARD_AGENT_TOKEN": TOKEN})  # its own 60 s time-out
    assert time.monotonic() - started < 30
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len([line for line in lines if "will not be sent" in line]) == len(expected), proc.stderr
    assert manager.order[0] == "good" and len(manager.order) == 2  # the old item, then this run's report
    _check_rejected(spool, expected)


def test_read_item_refuses_what_is_not_a_regular_json_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "real", tmp_path / "link")
    (tmp_path / "real").write_text(json.dumps(GOOD))
    assert read_item(str(tmp_path / "real")) == GOOD
    with pytest.raises(OSError, match="not a regular file"):
        _within(5, lambda: read_item(str(tmp_path / "fifo")))
    with pytest.raises(OSError, match="symbolic links"):
        read_item(str(tmp_path / "link"))  # even to a good file: the spool holds no links
    (tmp_path / "max").write_text(" " * (MAX_ITEM_BYTES - 2) + "{}")
    assert read_item(str(tmp_path / "max")) == {}  # exactly the cap is taken


def test_a_retry_counter_that_is_a_fifo_or_a_link_counts_as_none(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.retry")
    os.symlink("/dev/zero", tmp_path / "b.retry")
    assert _within(5, lambda: read_retry(str(tmp_path / "a.retry"))) is None
    assert _within(5, lambda: read_retry(str(tmp_path / "b.retry"))) is None
