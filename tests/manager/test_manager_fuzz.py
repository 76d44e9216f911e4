"""No client input gets a 5xx, on a real SQLite file and a real PostgreSQL server:

- schemathesis generates requests from /openapi.json (valid and invalid: both generation modes,
  NUL bytes included) for every operation, and checks ``not_a_server_error``;
- hypothesis takes a real report and breaks it: any JSON value anywhere (huge integers, NaN and
  Infinity as raw tokens, NUL characters, deep nesting), then checks that the answer is 200, 400,
  413 or 422 and that every page and API answer about that node is still 200;
- hypothesis forgets nodes (``DELETE /api/v1/nodes/NAME`` with the admin token, any name) between
  reports, events and heartbeats of the same nodes: never a 5xx, and the nodes come back.

Example counts are modest (2 shared cores); the counts run are printed at the end of the module.
"""

from __future__ import annotations

import copy
import json
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from oomguard.manager.app import create_app
from oomguard.manager.db import migrate
from oomguard.manager.settings import Settings
from tests.helpers.fuzz import examples
from tests.helpers.manager import db_url_of, fixture_report, json_paths, local_client

COUNTS = {"schemathesis cases": 0, "hypothesis bodies": 0, "hypothesis deletes": 0, "server errors": 0}
ADMIN = "fuzz-admin-token"
BASE = fixture_report()
NODES = ("fuzz-a", "fuzz-b", "fuzz.c_1")


def _db_url(kind: str, tmp: Path) -> str:
    return db_url_of(kind, tmp, "fuzz_", "fuzz.db")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzz_app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One app per database, no agent or viewer token (loopback): every route is reachable, the
    deepest code runs; an admin token, so that DELETE runs past its check when given it."""
    url = _db_url(request.param, tmp_path_factory.mktemp("fuzz"))
    migrate(url)
    return create_app(Settings(db_url=url, admin_token=ADMIN))


@pytest.fixture(scope="module", autouse=True)
def _say_counts() -> Iterator[None]:
    yield
    print(f"\nfuzzing: {COUNTS}", file=sys.__stderr__)


@pytest.mark.slow
def test_api_never_answers_5xx(fuzz_app: Any) -> None:
    """Every operation of /openapi.json, with valid and invalid requests (schemathesis's two
    generation modes), against the app on this database. (Driven by hand: schemathesis's lazy
    pytest loader does not run under pytest 9.)"""
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app, headers={"Host": "localhost"})
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operations.append(result.ok())
    assert len(operations) >= 7, [op.label for op in operations]
    for operation in operations:
        cases = st.one_of(*(operation.as_strategy(generation_mode=mode) for mode in GenerationMode))  # type: ignore[attr-defined]  # a StrEnum: mypy reads 3.10

        @given(case=cases)
        @settings(max_examples=examples(25), deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case: schemathesis.Case[Any]) -> None:
            COUNTS["schemathesis cases"] += 1
            response = case.call(base_url="http://localhost")
            if response.status_code >= 500:
                COUNTS["server errors"] += 1
            case.validate_response(response, checks=[not_a_server_error])

        run()


# -- report bodies ---------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12,
)


PATHS = json_paths(BASE)


def _set(report: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Put *value* at *path*, when an earlier change has not taken the path away."""
    node: Any = report
    for i, step in enumerate(path):
        fits = isinstance(node, dict) or (isinstance(node, list) and isinstance(step, int) and step < len(node))
        if not fits or (i < len(path) - 1 and isinstance(node, dict) and step not in node):
            return
        if i == len(path) - 1:
            node[step] = value
            return
        node = node[step]


@st.composite
def report_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    report = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(0, 3))):
        _set(report, draw(st.sampled_from(PATHS)), draw(JSON))
    depth = draw(st.sampled_from([0, 0, 0, 31, 33, 300]))
    if depth:
        nested: Any = "bottom"
        for _ in range(depth):
            nested = [nested]
        _set(report, draw(st.sampled_from(PATHS)), nested)
    node = draw(st.sampled_from(NODES))
    envelope: dict[str, Any] = {"node": node, "id": uuid.uuid4().hex, "report": report}
    if draw(st.booleans()):
        envelope["time"] = draw(st.text(max_size=30) | st.just("2026-11-30T19:37:18\x00Z"))
    if draw(st.booleans()):
        envelope["interval_s"] = draw(st.floats(allow_nan=True, allow_infinity=True) | st.integers())
    return node, json.dumps(envelope, allow_nan=True).encode()


@pytest.fixture(scope="module")
def body_client(fuzz_app: Any) -> Iterator[Any]:
    with local_client(fuzz_app) as client:
        yield client


@given(body=report_bodies())
@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
def test_report_bodies_never_get_5xx_and_every_page_stays_up(body_client: Any, body: tuple[str, bytes]) -> None:
    COUNTS["hypothesis bodies"] += 1
    node, raw = body
    headers = {"Content-Type": "application/json"}
    answer = body_client.post("/api/v1/reports", content=raw, headers=headers)
    if answer.status_code >= 500:
        COUNTS["server errors"] += 1
    assert answer.status_code in (200, 400, 413, 422), answer.text
    assert json.loads(answer.text)  # every refusal is valid JSON (no NaN echoed back)
    for path in ("/", f"/nodes/{node}", f"/api/v1/nodes/{node}", "/api/v1/nodes", "/api/v1/alerts", "/metrics"):
        page = body_client.get(path)
        if page.status_code >= 500:
            COUNTS["server errors"] += 1
        assert page.status_code in (200, 404), (path, page.status_code, page.text[:300])


# -- forgetting nodes --------------------------------------------------------------------------

NAMES = (
    st.sampled_from(NODES) | st.text(max_size=140) | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", fullmatch=True)
)
WRITES = st.sampled_from(["report", "event", "heartbeat", "delete", "delete"])


@pytest.fixture(scope="module")
def admin_client(fuzz_app: Any) -> Iterator[Any]:
    """The fuzzed app's database, with a failure limit no run exhausts (schemathesis's random
    tokens spend the fuzzed app's own)."""
    url = fuzz_app.state.settings.db_url
    with local_client(create_app(Settings(db_url=url, admin_token=ADMIN, login_burst=10**9))) as client:
        yield client


@given(steps=st.lists(st.tuples(WRITES, NAMES), min_size=1, max_size=6))
@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@pytest.mark.slow
def test_forgetting_nodes_never_gets_5xx(admin_client: Any, steps: list[tuple[str, str]]) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}", "Accept": "application/json"}
    for write, name in steps:
        COUNTS["hypothesis deletes"] += write == "delete"
        if write == "delete":
            answer = admin_client.delete(f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}", headers=admin)
            expected: tuple[int, ...] = (204, 404, 405, 422)
        else:
            body: dict[str, Any] = {"node": name, "id": uuid.uuid4().hex}
            if write == "report":
                body["report"] = BASE
            else:
                body["event"] = {"event": "heartbeat", "interval_s": 60} if write == "heartbeat" else {"event": "start"}
            answer = admin_client.post(f"/api/v1/{write.replace('heartbeat', 'event')}s", json=body)
            expected = (200, 422)
        if answer.status_code >= 500:
            COUNTS["server errors"] += 1
        assert answer.status_code in expected, (write, name, answer.status_code, answer.text[:300])
        if answer.status_code == 204:
            assert admin_client.get(f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}").status_code == 404
        elif write != "delete" and answer.status_code == 200:
            assert admin_client.get(f"/api/v1/nodes/{name}").status_code == 200
    for path in ("/", "/api/v1/nodes", "/api/v1/alerts", "/metrics"):
        assert admin_client.get(path).status_code == 200, path
