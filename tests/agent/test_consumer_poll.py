"""``oomguard agent --cuzk-status``: CuZK's status JSON parsed (its source's shape, every field, in
tests/fixtures/cuzk/status.json), any text parsed without raising, and the GET against a real
server on 127.0.0.1 that answers as CuZK's does, or misbehaves (404, garbage, a hang, a drip, a
redirect, a body that is not UTF-8, a dead port); then the CLI's report carrying it to a manager."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomguard.agent.consumers import MAX_BYTES, check_status_url, parse_cuzk_status, poll_cuzk
from oomguard.errors import BadParameter
from oomguard.units import MAX_SIZE
from tests.conftest import run_oomguard
from tests.helpers.agent_fake import TOKEN, FakeManager
from tests.helpers.cuzk import STATUS_JSON, fake_cuzk, status_fixture
from tests.helpers.fuzz import examples

URL = "http://127.0.0.1:9821/status"
GiB = 1 << 30
FIXTURE_VALUES = {"budget_bytes": 534723428352, "used_bytes": 197939314688, "available_bytes": 336784113664}
KEYS = {"name", "url", "budget_bytes", "used_bytes", "available_bytes", "error"}


def test_the_fixture_has_every_field_of_cuzks_status_snapshot() -> None:
    """The shape of status.rs L21-128 (StatusSnapshot and the structs under it), every field there."""
    s = status_fixture()
    assert set(s) == {"uptime_secs", "memory", "synthesis", "pipelines", "gpu_workers", "allocations"} | {
        "counters",
        "buffers",
    }
    assert set(s["memory"]) == {"total_bytes", "used_bytes", "available_bytes"}
    assert set(s["synthesis"]) == {"max_concurrent", "active"}
    pipeline = s["pipelines"][0]
    assert set(pipeline) == {"job_id", "proof_kind", "started_secs_ago", "total_partitions", "partitions_done"} | {
        "partitions"
    }
    assert set(pipeline["partitions"][0]) == {"index", "state", "synth_ms", "gpu_ms"}
    assert set(s["gpu_workers"][0]) == {"worker_id", "gpu_ordinal", "state", "current_job"} | {
        "current_partition",
        "busy_secs",
    }
    assert set(s["allocations"]) == {"srs", "pce"}
    for entry in s["allocations"]["srs"] + s["allocations"]["pce"]:
        assert set(entry) == {"circuit_id", "bytes", "last_used_secs_ago", "evictable"}
    assert set(s["counters"]) == {"total_completed", "total_failed", "completed_by_kind", "failed_by_kind"} | {
        "queue_depth"
    }
    assert set(s["buffers"]) == {"synth_in_flight", "provers_in_flight", "aux_in_flight", "shells_in_flight"} | {
        "pending_handles"
    }
    m = s["memory"]
    assert m["total_bytes"] == 498 * GiB  # "auto" on a 503 GiB host: MemTotal minus the 5 GiB margin
    assert m["used_bytes"] + m["available_bytes"] == m["total_bytes"]
    held = sum(e["bytes"] for e in s["allocations"]["srs"] + s["allocations"]["pce"])
    assert held < m["used_bytes"]  # the SRS and PCE are acquired from the budget, the partitions too
    assert s["synthesis"]["max_concurrent"] == m["total_bytes"] // (9 * GiB)  # status.rs: total / SNAP partition


def test_the_parser_reads_cuzks_memory_from_the_fixture() -> None:
    entry = parse_cuzk_status(STATUS_JSON.read_text(), URL)
    assert entry == {"name": "cuzk", "url": URL, **FIXTURE_VALUES, "error": None}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "the answer is not JSON (CuZK's GET /status gives its status snapshot)"),
        ("<html>", "the answer is not JSON (CuZK's GET /status gives its status snapshot)"),
        ("[" * 100_000, "the answer is not JSON (CuZK's GET /status gives its status snapshot)"),
        ("1" * 5000, "the answer is not JSON (CuZK's GET /status gives its status snapshot)"),
        ("[]", "the answer is a list, not CuZK's status object"),
        ("null", "the answer is null, not CuZK's status object"),
        ("{}", "memory: missing"),
        ('{"memory": null}', "memory: missing"),
        ('{"memory": [1, 2, 3]}', "memory: a list, not an object"),
        ('{"memory": {"used_bytes": 1, "available_bytes": 2}}', "memory.total_bytes: missing"),
        ('{"memory": {"total_bytes": 3, "available_bytes": 2}}', "memory.used_bytes: missing"),
        ('{"memory": {"total_bytes": 3, "used_bytes": 1}}', "memory.available_bytes: missing"),
        (
            '{"memory": {"total_bytes": "498GiB", "used_bytes": 1, "available_bytes": 2}}',
            "memory.total_bytes: a string, not a whole number of bytes",
        ),
        (
            '{"memory": {"total_bytes": 1.5, "used_bytes": 1, "available_bytes": 2}}',
            "memory.total_bytes: 1.5, not a whole number of bytes",
        ),
        (
            '{"memory": {"total_bytes": 3, "used_bytes": true, "available_bytes": 2}}',
            "memory.used_bytes: a boolean, not a whole number of bytes",
        ),
        (
            '{"memory": {"total_bytes": 3, "used_bytes": 1, "available_bytes": NaN}}',
            "memory.available_bytes: nan, not a whole number of bytes",
        ),
        (
            '{"memory": {"total_bytes": -1, "used_bytes": 1, "available_bytes": 2}}',
            "memory.total_bytes: -1 is out of range (0 to 2**63 - 1)",
        ),
        (
            '{"memory": {"total_bytes": 18446744073709551615, "used_bytes": 1, "available_bytes": 2}}',
            "memory.total_bytes: 18446744073709551615 is out of range (0 to 2**63 - 1)",
        ),
    ],
)
def test_unknown_values_are_null_with_the_reason(text: str, why: str) -> None:
    entry = parse_cuzk_status(text, URL)
    assert entry == {"name": "cuzk", "url": URL, "budget_bytes": None, "used_bytes": None} | {
        "available_bytes": None,
        "error": why,
    }


def test_other_sections_may_change_without_the_parser_noticing() -> None:
    s = status_fixture()
    for key in ("pipelines", "allocations", "counters", "buffers", "uptime_secs"):
        s.pop(key)
    s["memory"]["something_new"] = "x"
    s["future"] = {"a": 1}
    assert parse_cuzk_status(json.dumps(s), URL) == {"name": "cuzk", "url": URL, **FIXTURE_VALUES, "error": None}
    zero = {"memory": {"total_bytes": 0, "used_bytes": 0, "available_bytes": MAX_SIZE}}
    assert parse_cuzk_status(json.dumps(zero), URL)["available_bytes"] == MAX_SIZE  # 0 is a value, not unknown


def _well_formed(entry: Any) -> None:
    assert isinstance(entry, dict) and set(entry) == KEYS and entry["name"] == "cuzk" and entry["url"] == URL
    values = [entry[k] for k in ("budget_bytes", "used_bytes", "available_bytes")]
    if entry["error"] is None:
        assert all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SIZE for v in values)
    else:
        assert values == [None, None, None]
        assert isinstance(entry["error"], str) and 0 < len(entry["error"]) <= 200 and "\n" not in entry["error"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
MEMORY = st.fixed_dictionaries(
    {},
    optional={k: JSON | st.integers(min_value=-(2**70), max_value=2**70) for k in ("total_bytes", "used_bytes")}
    | {"available_bytes": JSON},
)


@settings(max_examples=examples(500), deadline=None)
@given(st.text() | st.binary().map(lambda b: b.decode("utf-8", "replace")))
def test_any_text_parses_without_raising(text: str) -> None:
    _well_formed(parse_cuzk_status(text, URL))


@settings(max_examples=examples(500), deadline=None)
@given(JSON | st.fixed_dictionaries({"memory": MEMORY | JSON}, optional={"uptime_secs": JSON}))
def test_any_json_value_parses_without_raising(value: Any) -> None:
    entry = parse_cuzk_status(json.dumps(value), URL)
    _well_formed(entry)
    memory = value.get("memory") if isinstance(value, dict) else None
    if entry["error"] is None:  # read only from memory's three fields, as they are
        assert isinstance(memory, dict)
        assert entry["budget_bytes"] == memory["total_bytes"] and entry["used_bytes"] == memory["used_bytes"]


# --- the URL ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given_url", "polled"),
    [
        ("http://127.0.0.1:9821", "http://127.0.0.1:9821/status"),
        (" http://127.0.0.1:9821/ ", "http://127.0.0.1:9821/status"),
        ("http://prover-7:9821/status", "http://prover-7:9821/status"),
        ("http://[::1]:9821/status?x=1", "http://[::1]:9821/status?x=1"),
        ("http://0.0.0.0:9821", "http://0.0.0.0:9821/status"),  # status_listen copied as it is
    ],
)
def test_the_status_url_defaults_its_path_to_status(given_url: str, polled: str) -> None:
    assert check_status_url(given_url) == polled


@pytest.mark.parametrize(
    "bad",
    ["", "127.0.0.1:9821", "https://127.0.0.1:9821", "http://", "http://h:port", "http://u:p@h:1", "http://h/#x"],
)
def test_a_bad_status_url_is_a_bad_parameter(bad: str) -> None:
    for url in (bad, "http://h/" + "a" * 3000):
        with pytest.raises(BadParameter) as caught:
            check_status_url(url)
        assert caught.value.param == "cuzk_status"


def test_a_bad_status_url_is_one_usage_line_naming_the_flag(tmp_path: Path) -> None:
    proc = run_oomguard(
        "agent", "--once", "--no-gpu", "--manager", "http://127.0.0.1:9", "--spool", str(tmp_path), "--cuzk-status", "x"
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("oomguard: error: --cuzk-status: the URL must be http://HOST:PORT[/status]")
    assert proc.stderr.count("\n") == 1


# --- the GET, against a real server -------------------------------------------------------------


def test_the_poll_reads_cuzks_answer_from_a_real_server() -> None:
    with fake_cuzk() as cuzk:
        url = check_status_url(cuzk.url)
        assert poll_cuzk(url) == {"name": "cuzk", "url": url, **FIXTURE_VALUES, "error": None}
        assert cuzk.requests == ["GET /status HTTP/1.1"]


@pytest.mark.parametrize(
    ("mode", "path", "why"),
    [
        (None, "/metrics", "HTTP 404 Not Found"),
        ("garbage", "/status", "the answer is not JSON (CuZK's GET /status gives its status snapshot)"),
        ("error", "/status", "HTTP 500 Internal Server Error"),
        ("redirect", "/status", "HTTP 302 Found (redirects are not followed)"),
        ("latin1", "/status", "the answer is not UTF-8 text"),
    ],
)
def test_a_failed_poll_is_null_values_and_one_line(mode: str | None, path: str, why: str) -> None:
    with fake_cuzk(mode=mode) as cuzk:
        url = cuzk.url + path
        assert poll_cuzk(url) == {"name": "cuzk", "url": url, "budget_bytes": None, "used_bytes": None} | {
            "available_bytes": None,
            "error": why,
        }


@pytest.mark.parametrize("mode", ["hang", "drip"])
def test_a_server_that_stalls_costs_the_timeout_and_no_more(mode: str) -> None:
    with fake_cuzk(mode=mode) as cuzk:
        t0 = time.monotonic()
        entry = poll_cuzk(cuzk.url + "/status", timeout=0.5)
        spent = time.monotonic() - t0
    assert entry["error"] == "no whole answer within 0.5s" and entry["budget_bytes"] is None
    assert spent < 0.5 + 0.5  # the whole answer within the timeout (a drip's byte comes every 0.2 s)


def test_a_dead_port_and_an_oversized_answer() -> None:
    with fake_cuzk() as cuzk:
        dead = cuzk.url + "/status"
    assert poll_cuzk(dead)["error"] == "unreachable: connection refused"
    big = json.dumps({**status_fixture(), "pad": "x" * (MAX_BYTES + 1)}).encode()
    with fake_cuzk(body=big) as cuzk:
        entry = poll_cuzk(cuzk.url + "/status")
    assert entry["error"] == f"the answer is over {MAX_BYTES} bytes" and entry["budget_bytes"] is None
    with fake_cuzk(body=big) as cuzk:  # the same answer, allowed its size: read whole
        assert poll_cuzk(cuzk.url + "/status", max_bytes=2 * MAX_BYTES)["budget_bytes"] == 498 * GiB


def test_no_proxy_is_asked_for_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nobody listens there
    with fake_cuzk() as cuzk:
        assert poll_cuzk(cuzk.url + "/status")["error"] is None


# --- the agent's report ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", [None, "garbage"])
def test_the_agents_report_carries_cuzks_view(manager: FakeManager, tmp_path: Path, mode: str | None) -> None:
    with fake_cuzk(mode=mode) as cuzk:
        proc = run_oomguard(
            "agent",
            *("--once", "--no-gpu", "--manager", manager.url, "--token", TOKEN, "--spool", str(tmp_path)),
            *("--cuzk-status", cuzk.url),
        )
    assert proc.returncode == 0, proc.stderr
    (report,) = manager.stored_reports()
    (entry,) = report["consumers"]
    if mode is None:
        assert entry == {"name": "cuzk", "url": cuzk.url + "/status", **FIXTURE_VALUES, "error": None}
    else:
        assert entry["budget_bytes"] is None and entry["error"].startswith("the answer is not JSON")
    assert report["memory"]["effective_bytes"] is not None  # the kernel's view beside it


def test_without_the_flag_no_consumers(manager: FakeManager, tmp_path: Path) -> None:
    proc = run_oomguard(
        "agent", "--once", "--no-gpu", "--manager", manager.url, "--token", TOKEN, "--spool", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    assert "consumers" not in manager.stored_reports()[0]


def test_the_help_names_the_flag() -> None:
    proc = run_oomguard("agent", "--help")
    assert proc.returncode == 0 and "--cuzk-status URL" in proc.stdout and "[--cuzk-status URL]" in proc.stdout
