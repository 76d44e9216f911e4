"""The agent's spool on a real file system: durable, ordered, private; rejected/ bounded; spool
faults are one-line ``SpoolError`` values; defaults from the environment."""

from __future__ import annotations

import json
import os
import pkgutil
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oomguard.agent import NODE_NAME_CHARS, Spool, default_node_name, default_spool_dir, sanitize_node_name
from oomguard.agent.rejected import WHY_SUFFIX, _prune, move_to_rejected, read_retry
from oomguard.agent.spool import SpoolError, parse_name
from oomguard.nodes import is_valid_node_name
from tests.helpers.agent_fake import names


def test_put_is_complete_and_private(tmp_path: Path) -> None:
    d = tmp_path / "a" / "spool"
    spool = Spool(str(d))
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    body = {"node": "n", "id": "abc", "report": {"text": 'ü\n"q"', "big": list(range(1000))}, "interval_s": 1.5}
    path = spool.put("report", body)
    assert os.path.dirname(path) == str(d) and os.path.basename(path) == "000000000001-report.json"
    assert json.loads(Path(path).read_text(encoding="utf-8")) == body
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(d) == ["000000000001-report.json"]  # no temp file left behind
    with pytest.raises(ValueError):
        spool.put("metrics", body)
    with pytest.raises(TypeError):
        spool.put("report", {"x": object()})
    assert os.listdir(d) == ["000000000001-report.json"]  # a failed put leaves nothing


def test_pending_ignores_temp_files_strays_counters_and_rejected(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    a = spool.put("report", {"id": "a"})
    (tmp_path / ".tmp-0123abcd").write_text('{"id": "half')  # a crash between write and rename
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "000000000009-metrics.json").write_text("{}")
    (tmp_path / "000000000001-report.json.retry").write_text('{"answers": 1, "first": 0}')
    (tmp_path / "rejected").mkdir()
    (tmp_path / "rejected" / "000000000005-report.json").write_text("{}")
    b = spool.put("event", {"id": "b"})
    assert spool.pending() == [a, b]
    assert os.path.basename(b) == "000000000006-event.json"  # after the rejected one


def test_stale_temp_files_and_orphan_counters_are_removed(tmp_path: Path) -> None:
    old = tmp_path / ".tmp-old"
    old.write_text("{")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    fresh = tmp_path / ".tmp-fresh"  # maybe another process writing right now
    fresh.write_text("{")
    kept = tmp_path / "000000000001-report.json"
    kept.write_text("{}")
    (tmp_path / "000000000001-report.json.retry").write_text("{}")
    (tmp_path / "000000000002-report.json.retry").write_text("{}")  # its item was delivered
    Spool(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [".tmp-fresh", "000000000001-report.json", "000000000001-report.json.retry"]


def test_seq_order_across_spool_instances(tmp_path: Path) -> None:
    d = str(tmp_path)
    first = Spool(d)
    p1 = first.put("report", {"id": "1"})
    p2 = first.put("event", {"id": "2"})
    second = Spool(d)  # a process restart
    p3 = second.put("report", {"id": "3"})
    p4 = first.put("event", {"id": "4"})  # an older instance still running alongside
    assert names([p1, p2, p3, p4]) == [
        "000000000001-report.json",
        "000000000002-event.json",
        "000000000003-report.json",
        "000000000004-event.json",
    ]
    assert Spool(d).pending() == [p1, p2, p3, p4]
    first.done(p1)
    first.done(p1)  # twice: no error
    assert names([Spool(d).put("report", {"id": "5"})]) == ["000000000005-report.json"]


def test_concurrent_puts_never_collide(tmp_path: Path) -> None:
    spools = [Spool(str(tmp_path)) for _ in range(4)]  # as if four processes
    paths: list[str] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        for i in range(25):
            p = spools[k].put("event", {"id": f"{k}-{i}"})
            with lock:
                paths.append(p)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 100
    pending = spools[0].pending()
    ids = [json.loads(Path(p).read_text())["id"] for p in pending]
    assert len(set(ids)) == 100
    for k in range(4):  # each writer's own items are in its put order
        assert [i for i in ids if i.startswith(f"{k}-")] == [f"{k}-{i}" for i in range(25)]


# --- faults of the directory: values, one line each ------------------------------------------------


def test_a_removed_spool_is_created_again(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path / "spool"))
    os.rmdir(tmp_path / "spool")  # a tmp cleaner
    assert spool.pending() == []
    assert names([spool.put("report", {"id": "x"})]) == ["000000000001-report.json"]


def test_a_file_in_place_of_the_spool_is_a_spool_error(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    spool = Spool(str(d))
    put = spool.put("report", {"id": "x"})
    os.unlink(put)
    os.rmdir(d)
    d.write_text("in the way")
    with pytest.raises(SpoolError) as e:
        spool.put("report", {"id": "y"})
    assert str(e.value) == f"cannot write to the spool {d} (not a directory)"
    with pytest.raises(SpoolError, match=r"^cannot read the spool .* \(not a directory\)$"):
        spool.pending()
    with pytest.raises(SpoolError, match=r"^cannot move "):
        spool.reject(str(d / "000000000001-report.json"), {"reason": "rejected"})


# --- rejected/ ---------------------------------------------------------------------------------


def test_rejected_keeps_the_newest(tmp_path: Path) -> None:
    rejected = tmp_path / "rejected"
    for seq in range(1, 8):
        item = tmp_path / f"{seq:012d}-report.json"
        item.write_text("{}")
        move_to_rejected(str(item), str(rejected), {"reason": "rejected", "seq": seq})
    _prune(str(rejected), keep=3)
    left = sorted(os.listdir(rejected))
    assert left == [f"{seq:012d}-report.json{sfx}" for seq in (5, 6, 7) for sfx in ("", WHY_SUFFIX)]
    assert json.loads((rejected / f"{7:012d}-report.json.why").read_text()) == {"reason": "rejected", "seq": 7}


@given(st.binary(max_size=200))
def test_a_retry_counter_never_raises(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("retry") / "x.retry"
    path.write_bytes(data)
    state = read_retry(str(path))
    assert state is None or (state[0] >= 0 and state[1] == state[1])


@given(st.text(max_size=40))
def test_parse_name_never_raises(name: str) -> None:
    parsed = parse_name(name)
    assert parsed is None or (parsed[0] >= 0 and parsed[1] in ("report", "event"))


# --- defaults from the environment ---------------------------------------------------------------


def test_default_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "host a")
    assert default_node_name({"VAST_CONTAINERLABEL": "C.12345"}) == "C.12345"
    assert default_node_name({"VAST_CONTAINERLABEL": "my box/1"}) == "my-box-1"
    assert default_node_name({"VAST_CONTAINERLABEL": "_label"}) == "label"  # the manager refused "_label"
    assert default_node_name({"VAST_CONTAINERLABEL": "Ärger-1"}) == "Arger-1"  # and "-rger-1"
    assert default_node_name({"VAST_CONTAINERLABEL": ""}) == "host-a"
    assert default_node_name({}) == "host-a"
    monkeypatch.setattr(socket, "gethostname", lambda: ".local")
    assert default_node_name({}) == "local"
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert default_node_name({}) == "node"
    assert all(is_valid_node_name(default_node_name({"VAST_CONTAINERLABEL": x})) for x in ("…", "日本", "-", "."))


def test_default_spool_dir_precedence() -> None:
    env = {"OOMGUARD_SPOOL": "/s/p", "XDG_STATE_HOME": "/state", "HOME": "/home/u"}
    assert default_spool_dir(env) == "/s/p"
    del env["OOMGUARD_SPOOL"]
    assert default_spool_dir(env) == "/state/oomguard/spool"
    env["XDG_STATE_HOME"] = "relative/state"  # invalid per the XDG spec: ignored
    assert default_spool_dir(env) == "/home/u/.local/state/oomguard/spool"
    assert default_spool_dir({"HOME": "/root", "OOMGUARD_SPOOL": ""}) == "/root/.local/state/oomguard/spool"
    assert default_spool_dir({}).endswith(os.path.join(".local", "state", "oomguard", "spool"))


def test_the_package_exports_what_the_commands_use() -> None:
    from oomguard import agent

    public = {name for name in vars(agent) if not name.startswith("_")} - {"annotations"}
    modules = {m.name for m in pkgutil.iter_modules(agent.__path__)}  # a submodule imported is an attribute too
    assert sorted(agent.__all__) == sorted(public - modules)
    assert set(agent.__all__) == {
        "EventForwarder",
        "NODE_NAME_CHARS",
        "Sender",
        "Spool",
        "default_node_name",
        "default_spool_dir",
        "gate_event",
        "node_labels",
        "run_agent",
        "sanitize_node_name",
    }
    assert agent.sanitize_node_name is sanitize_node_name and NODE_NAME_CHARS == agent.NODE_NAME_CHARS
