"""The wire messages beside the report, each against its JSON Schema (issue 35, item 5):
``event.schema.json`` (the supervisor's ``--events`` lines, the forwarder's heartbeat, the
entrypoint's gate), ``observation.schema.json`` (``run --profile --manager``) and
``recommendation.schema.json`` (the manager's answer to ``--learned``).

For each: the writer's real output validates (``jsonschema``), the reader takes it, and the reader
refuses what the schema refuses on hand-made bad cases; the ``Literal`` types of ``_types.py`` are
the schemas' enums, as ``tests/test_report_types.py`` checks the report's ``TypedDict``s.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import typing
import uuid
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pydantic
import pytest

from oomguard import _types
from oomguard.agent.gate import STEPS, gate_event
from oomguard.policy.learned import ORIGINS, SOURCES, apply, parse_answer
from oomguard.policy.plan import Shape
from oomguard.supervisor import exits, peak
from oomguard.supervisor.events import FIELDS, EventLog
from oomguard.supervisor.exits import exit_fields
from oomguard.supervisor.observe import observation
from tests.conftest import REPO
from tests.helpers.wait import wait_until

NAMES = ("event", "observation", "recommendation")
SCHEMAS: dict[str, dict[str, Any]] = {
    name: json.loads(resources.files("oomguard").joinpath(f"{name}.schema.json").read_text()) for name in NAMES
}
VALIDATORS = {name: jsonschema.Draft202012Validator(schema) for name, schema in SCHEMAS.items()}
MiB = 1 << 20
GiB = 1 << 30
NOW = 1_800_000_000_000
SHAPE = Shape(64 * MiB, 16 * MiB, profile="tiny")
PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}
ENV.pop("OOMGUARD_BUDGET", None)


def problems(name: str, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"[:300] for e in VALIDATORS[name].iter_errors(doc)]


def assert_valid(name: str, doc: Any) -> None:
    bad = problems(name, doc)
    assert bad == [], f"{name}.schema.json refuses {doc!r}:\n" + "\n".join(bad)


# -- the schemas ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_each_schema_is_draft_2020_12_with_a_description_on_every_field(name: str) -> None:
    schema = SCHEMAS[name]
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema" and schema["description"]
    missing: list[str] = []
    stack: list[tuple[str, Any]] = [(name, schema)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, dict):
            for key, sub in (node.get("properties") or {}).items():
                if isinstance(sub, dict) and not sub.get("description"):
                    missing.append(f"{where}.{key}")
                stack.append((f"{where}.{key}", sub))
            if "items" in node:  # the conditions (oneOf, allOf) only narrow fields described here
                stack.append((f"{where}[]", node["items"]))
    assert missing == []


def test_the_schemas_ship_in_the_wheel_beside_schema_json() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    package_data = next(
        line for line in pyproject.splitlines() if line.startswith("oomguard = [") and "py.typed" in line
    )
    for name in NAMES:
        assert f'"{name}.schema.json"' in package_data
        assert (REPO / "src" / "oomguard" / f"{name}.schema.json").is_file()  # `make pyz` copies the folder


# -- one definition: the Literal types are the schemas' enums ----------------------------------------


def enum(node: dict[str, Any]) -> set[Any]:
    return {v for v in node["enum"] if v is not None}


def values(tp: Any) -> set[Any]:
    return set(typing.get_args(tp))


def test_the_literal_types_are_the_schemas_enums() -> None:
    event, obs, rec = (SCHEMAS[n]["properties"] for n in NAMES)
    assert values(_types.EventName) == enum(event["event"]) == set(_types.EVENT_NAMES)
    supervisor, heartbeat, gate = SCHEMAS["event"]["oneOf"]
    assert values(_types.SupervisorEventName) == set(supervisor["properties"]["event"]["enum"])
    assert values(_types.EventName) - values(_types.SupervisorEventName) == {
        heartbeat["properties"]["event"]["const"],
        gate["properties"]["event"]["const"],
    }
    assert values(_types.ExitReason) == enum(event["reason"]) == set(_types.EXIT_REASONS)
    assert values(_types.OomVictim) == enum(event["oom_victim"])
    assert values(_types.PeakSource) == enum(event["peak_source"])
    assert values(_types.GraceSource) == enum(event["grace_source"])
    assert values(_types.MemoryLimitedBy) == enum(event["limited_by"])  # the report's memory.limited_by
    assert values(_types.GateStep) == enum(event["step"]) == set(STEPS)
    assert values(_types.LearnedOrigin) == enum(event["learned"]["properties"]["origin"]) == set(ORIGINS)
    assert values(_types.RecommendationSource) == enum(event["learned"]["properties"]["source"])
    assert values(_types.Outcome) == enum(obs["outcome"]) == set(_types.OUTCOMES)
    assert set(_types.FAILURES) == values(_types.Outcome) - {"ok"}
    assert values(_types.RecommendationSource) == enum(rec["source"]) == set(SOURCES)
    # A forecast's scope: one of samples, never a floor nor the declared size.
    assert enum(rec["peak_p95_source"]) == values(_types.RecommendationSource) - {"declared", "floor"}


def test_the_run_side_names_the_same_values() -> None:
    """The supervisor's own names for the values are the types' (exits.py, peak.py, grace.py)."""
    assert set(exits.REASONS) == {exits.CLEAN, exits.EXIT, exits.SIGNAL, exits.OOM_KILL, exits.PRESSURE_STOP}
    assert set(exits.REASONS) == values(_types.ExitReason)
    assert {exits.WORKER, exits.DESCENDANT, exits.GROUP} == values(_types.OomVictim)
    assert {peak.VMHWM, *peak.CGROUP_SOURCES.values()} == values(_types.PeakSource)


def test_the_words_and_rules_keyed_by_these_values_name_exactly_the_defined_ones() -> None:
    """The maps that say a value in words, or pick some of them, name no value the types lack."""
    from oomguard.manager.store import writer
    from oomguard.manager.web import formatting
    from oomguard.supervisor.adapt import STEP_DOWN

    assert set(formatting.REASONS) == set(formatting.AFTER) == set(_types.EXIT_REASONS)
    assert set(STEP_DOWN) == set(writer.COUNTERS) == set(_types.FAILURES)  # the failures: counted, stepped down


def test_the_supervisor_s_fields_are_the_schema_s() -> None:
    props = SCHEMAS["event"]["properties"]
    supervisor = SCHEMAS["event"]["oneOf"][0]
    assert list(props)[: len(FIELDS)] == list(FIELDS)  # in the order of the lines
    assert supervisor["required"] == list(FIELDS)
    assert set(props) - set(FIELDS) == {"interval_s", "step", "passed"}  # the heartbeat's, the gate's


def test_the_manager_s_bodies_declare_only_fields_of_the_schemas() -> None:
    from oomguard.manager.bodies import EventIn, ObservationIn

    assert set(EventIn.model_fields) <= set(SCHEMAS["event"]["properties"])
    obs = SCHEMAS["observation"]
    assert set(ObservationIn.model_fields) == set(obs["properties"])
    assert {n for n, f in ObservationIn.model_fields.items() if f.is_required()} == set(obs["required"])
    from oomguard.nodes import NODE_CLASS_PATTERN, PROFILE_PATTERN

    assert obs["properties"]["profile"]["pattern"] == PROFILE_PATTERN
    assert obs["properties"]["node_class"]["pattern"] == NODE_CLASS_PATTERN


# -- events: the writers ---------------------------------------------------------------------------


def decision() -> dict[str, Any]:
    """``--learned``'s decision (the ``learned`` field) from a real recommendation."""
    from oomguard.manager.learning import recommend

    answer = parse_answer(recommend(NOW, "n1", "c1", [sample(i) for i in range(4)], str).as_json(str))
    assert not isinstance(answer, str)
    return apply(SHAPE, answer, origin="manager", fetched="2027-01-01T00:00:00Z", ceiling=4 * GiB)[1]


def emitted(tmp_path: Path) -> list[dict[str, Any]]:
    """Every kind of event the supervisor emits, through a real ``EventLog`` into a file, with the
    fields each carries in ``supervise.py`` (guard, learned, an OOM kill's); the lines read back."""
    path = tmp_path / f"events-{uuid.uuid4().hex}.jsonl"
    log = EventLog(str(path), stderr=io.StringIO())
    ctx: dict[str, Any] = {
        "budget_bytes": 3 * GiB,
        "concurrency": 4,
        "effective_bytes": 4 * GiB,
        "limited_by": "cgroup-v2",
    }
    ctx["learned"] = decision()
    guard: dict[str, Any] = {
        "guard_margin_bytes": 200 * MiB,
        "working_set_peak_bytes": 3900 * MiB,
        "grace_bytes": 64 * MiB,
    }
    guard |= {"grace_source": "learned", "grace_high_bytes": 3 * GiB, "stop_working_set_bytes": 3800 * MiB}
    guard |= {"stop_rate_bytes_per_s": 50 * MiB, "grown_after_stop_bytes": 12 * MiB}
    try:
        log.emit("start", pid=4242, **ctx, warnings=["budget-exceeds-limit"], message="warning budget-exceeds-limit")
        common = {"pid": 4242, **ctx, "reason": "pressure-stop", "oom_kills": 0, "oom_victim": None, **guard}
        common |= exit_fields(-15) | {"stop_finished": True, "outside_bytes": None}
        log.emit("exit", duration_s=12.5, peak_bytes=3900 * MiB, peak_source="memory.peak", message="m", **common)
        log.emit("restart", delay_s=1.0, message="after a pressure stop: concurrency 4 -> 3", **common)
        killed = {"pid": 4243, **ctx, "reason": "oom-kill", "oom_kills": 1, "oom_victim": "descendant"}
        killed |= exit_fields(-9) | {"outside_bytes": 300 * MiB}
        log.emit("exit", duration_s=3.0, peak_bytes=None, peak_source=None, message="peak unknown", **killed)
        log.emit("give-up", message="2 restarts within 600s", **killed)
        for reason, rc in (("clean", 0), ("exit", 5), ("signal", -2)):
            ended = {"pid": 4244, **ctx, "reason": reason, "oom_kills": None, "oom_victim": None} | exit_fields(rc)
            log.emit("exit", duration_s=1.0, peak_bytes=200 * MiB, peak_source="vmhwm", message=None, **ended)
        log.emit("stop", message="stopped by signal 15", **ended)
        log.emit("give-up", message="render: cannot write", budget_bytes=3 * GiB)  # a failed --render
    finally:
        log.close()
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_event_the_supervisor_writes_fits_the_schema_and_the_manager_takes_it(tmp_path: Path) -> None:
    from oomguard.manager.bodies import EventIn

    lines = emitted(tmp_path)
    assert {e["event"] for e in lines} == set(_types.SUPERVISOR_EVENT_NAMES)
    assert {e["reason"] for e in lines} - {None} == set(_types.EXIT_REASONS)
    for e in lines:
        assert_valid("event", e)
        EventIn.model_validate(e)


def real_run(
    tmp_path: Path, *args: str, worker: str = "exit 4", wait: Callable[[Path], None] | None = None
) -> list[dict[str, Any]]:
    ev = tmp_path / "ev.jsonl"
    command = [PY, "-m", "oomguard", "run", "--budget", "1GiB", "--events", str(ev), *args, "--", "sh", "-c", worker]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        if wait is not None:
            wait(tmp_path)
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    return [json.loads(line) for line in ev.read_text().splitlines()]


def _until_ready(tmp_path: Path) -> None:
    wait_until((tmp_path / "ready").exists, what="the worker's start (its ready file)")


def test_a_real_run_s_events_fit_the_schema(tmp_path: Path) -> None:
    from oomguard.manager.bodies import EventIn, ObservationIn

    failing = real_run(
        tmp_path, "--per-job", "64MiB", "--backoff-initial", "10ms", "--max-restarts", "1", worker="sleep 0.2; exit 4"
    )
    assert [e["event"] for e in failing] == ["start", "exit", "restart", "start", "exit", "give-up"]
    (tmp_path / "ev.jsonl").unlink()
    refused = real_run(tmp_path, "--per-job", "2GiB")  # the budget cannot hold one job: give-up, no start
    assert [e["event"] for e in refused] == ["give-up"] and refused[0]["pid"] is None
    (tmp_path / "ev.jsonl").unlink()
    worker = f"touch {tmp_path / 'ready'}; exec sleep 60"
    stopped = real_run(tmp_path, "--restart", "always", worker=worker, wait=_until_ready)
    assert [e["event"] for e in stopped] == ["start", "exit", "stop"] and stopped[1]["reason"] == "signal"
    for e in failing + refused + stopped:
        assert_valid("event", e)
        EventIn.model_validate(e)
    # and the observations its exits make, as `run --profile --manager` sends them
    seen = [o for o in (observation(e, SHAPE) for e in failing) if o is not None]
    assert len(seen) == 2
    for o in seen:
        assert_valid("observation", o)
        ObservationIn.model_validate(o)


@pytest.fixture
def fake_manager() -> Iterator[Any]:
    from tests.helpers.agent_fake import running_manager

    yield from running_manager()


def test_what_the_forwarder_and_the_gate_post_fits_the_schema(fake_manager: Any, tmp_path: Path) -> None:
    """The events, observations and heartbeats ``run --manager`` posts, and the entrypoint's gate."""
    from oomguard.agent import EventForwarder
    from oomguard.manager.bodies import EventEnvelope, ObservationEnvelope
    from tests.helpers.agent_fake import TOKEN

    sink = EventForwarder(
        fake_manager.url,
        TOKEN,
        "n1",
        str(tmp_path / "spool"),
        heartbeat_s=0.05,
        observe=lambda e: observation(e, SHAPE),
    )
    for e in emitted(tmp_path):
        sink(e)
    sink(gate_event("plan", 3, "oomguard: error: no room"))

    def kinds() -> list[str]:
        return [r["body"].get("event", {}).get("event", "observation") for r in fake_manager.requests]

    try:
        wait_until(
            lambda: {"heartbeat", "gate"} <= set(kinds()) and kinds().count("observation") == 4,
            what="a heartbeat, the gate event and 4 observations at the fake manager",
        )
    finally:
        sink.close()
    for r in fake_manager.requests:
        body = r["body"]
        if "observation" in body:
            assert_valid("observation", body["observation"])
            ObservationEnvelope.model_validate(body)
        else:
            assert_valid("event", body["event"])
            EventEnvelope.model_validate(body)
    for step, code in (("check", 0), ("verify", 4)):
        assert_valid("event", gate_event(step, code, "oomguard verify: 1 of 2 children touched"))


# -- events: the reader refuses what the schema refuses ----------------------------------------------


def an_exit() -> dict[str, Any]:
    e: dict[str, Any] = dict.fromkeys(FIELDS)
    e |= {"event": "exit", "time": "2027-01-01T00:00:00.000Z", "pid": 7, "budget_bytes": GiB, "reason": "exit"}
    return e | {"concurrency": 4, "exit_code": 3, "duration_s": 1.5, "peak_bytes": 100 * MiB, "peak_source": "vmhwm"}


BAD_EVENTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "an unknown event": lambda e: e | {"event": "crash"},
    "an unknown exit reason": lambda e: e | {"reason": "oom"},
    "a reason of another type": lambda e: e | {"reason": 137},
    "a pid as text": lambda e: e | {"pid": "7"},
    "a negative budget": lambda e: e | {"budget_bytes": -1},
    "a size as a float": lambda e: e | {"peak_bytes": 1.5},
    "a duration as text": lambda e: e | {"duration_s": "1.5s"},
    "a message over 4000 characters": lambda e: e | {"message": "x" * 4001},
    "a time over 64 characters": lambda e: e | {"time": "2027" * 17},
    "no event": lambda e: {k: v for k, v in e.items() if k != "event"},
    "a gate without its step": lambda e: {
        "event": "gate",
        "time": e["time"],
        "passed": False,
        "exit_code": 3,
        "message": "m",
    },
    "a gate's passed as text": lambda e: gate_event("plan", 0, "") | {"passed": "no"},
    "a gate's unknown step": lambda e: gate_event("plan", 0, "") | {"step": "probe"},
    "a heartbeat's interval of 0": lambda e: {"event": "heartbeat", "time": e["time"], "interval_s": 0},
}


@pytest.mark.parametrize("case", sorted(BAD_EVENTS))
def test_the_manager_refuses_the_events_the_schema_refuses(case: str) -> None:
    from oomguard.manager.bodies import EventIn

    good = an_exit()
    assert_valid("event", good)
    EventIn.model_validate(good)
    bad = BAD_EVENTS[case](dict(good))
    assert problems("event", bad), f"the schema takes {case}"
    with pytest.raises(pydantic.ValidationError):
        EventIn.model_validate(bad)


@pytest.mark.parametrize("reason", _types.EXIT_REASONS)
def test_the_manager_takes_every_exit_reason_the_schema_takes(reason: str) -> None:
    from oomguard.manager.bodies import EventIn

    e = an_exit() | {"reason": reason}
    assert_valid("event", e)
    assert EventIn.model_validate(e).reason == reason


# -- observations ----------------------------------------------------------------------------------


def test_the_observations_of_real_exits_fit_the_schema_and_the_manager_takes_them(tmp_path: Path) -> None:
    from oomguard.manager.bodies import ObservationIn

    made = [observation(e, SHAPE, node_class) for e in emitted(tmp_path) for node_class in (None, "l4-small")]
    seen = [o for o in made if o is not None]
    assert {o["outcome"] for o in seen} == set(_types.OUTCOMES)
    for o in seen:
        assert_valid("observation", o)
        ObservationIn.model_validate(o)


def an_observation() -> dict[str, Any]:
    seen = observation(an_exit(), SHAPE)
    assert seen is not None
    return seen


BAD_OBSERVATIONS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "an unknown outcome": lambda o: o | {"outcome": "signal"},
    "an outcome of another type": lambda o: o | {"outcome": None},
    "no jobs": lambda o: o | {"concurrency": 0},
    "a peak as text": lambda o: o | {"peak_per_job_bytes": "1GiB"},
    "a negative baseline": lambda o: o | {"declared_baseline_bytes": -1},
    "a declared size of 0": lambda o: o | {"declared_per_job_bytes": 0},
    "a profile with a space": lambda o: o | {"profile": "my profile"},
    "a class with a space": lambda o: o | {"node_class": "l4 small"},
    "an unknown field": lambda o: o | {"gpu": "H100"},
    "no outcome": lambda o: {k: v for k, v in o.items() if k != "outcome"},
    "no time": lambda o: {k: v for k, v in o.items() if k != "time"},
}


@pytest.mark.parametrize("case", sorted(BAD_OBSERVATIONS))
def test_the_manager_refuses_the_observations_the_schema_refuses(case: str) -> None:
    from oomguard.manager.bodies import ObservationIn

    good = an_observation()
    assert_valid("observation", good)
    ObservationIn.model_validate(good)
    bad = BAD_OBSERVATIONS[case](dict(good))
    assert problems("observation", bad), f"the schema takes {case}"
    with pytest.raises(pydantic.ValidationError):
        ObservationIn.model_validate(bad)


# -- the recommendation ----------------------------------------------------------------------------


def sample(i: int, **kw: Any) -> Any:
    from oomguard.manager.learning import Sample

    fields: dict[str, Any] = {"node": "n1", "node_class": "c1", "received_ms": NOW - i * 60_000}
    fields |= {"declared_per_job": 14 * GiB, "peak_per_job": (10 + i % 3) * GiB, "declared_baseline": 40 * GiB}
    fields |= {"peak_baseline": None, "concurrency": 8, "outcome": "ok"}
    return Sample(**(fields | kw))


def recommendations() -> list[dict[str, Any]]:
    """``as_json`` of real recommendations, one of each source, with a floor, a budget, a forecast."""
    from oomguard.manager.learning import recommend
    from oomguard.manager.times import iso_ms

    many = [sample(i) for i in range(12)] + [sample(12, outcome="oom-kill", peak_per_job=16 * GiB)]
    others = [sample(i, node="n2") for i in range(3)]
    answers = [
        recommend(NOW, "n1", "c1", [], iso_ms),  # nothing observed: declared
        recommend(NOW, "n1", "c1", many, iso_ms),  # the node's, the floor of an OOM kill, the P95
        recommend(NOW, "n9", "c1", others, iso_ms),  # the class's
        recommend(NOW, "n9", "c9", others, iso_ms),  # the fleet's
        recommend(NOW, "n1", "c1", many, iso_ms, budget=200 * GiB),  # for a budget
        recommend(NOW, "n1", "c1", many, iso_ms, budget=50 * GiB),  # held at the room
        recommend(NOW, "n9", "c1", [sample(0, outcome="oom-kill")], iso_ms),  # one kill: the floor
    ]
    return [a.as_json(iso_ms) for a in answers]


def test_real_recommendations_fit_the_schema_and_the_run_side_reads_them() -> None:
    found = recommendations()
    assert {r["source"] for r in found} == set(_types.RECOMMENDATION_SOURCES)
    assert any(r["floor_bytes"] > 0 for r in found) and any(r["peak_p95_source"] for r in found)
    for r in found:
        assert list(r) == SCHEMAS["recommendation"]["required"]  # as_json writes every key, in order
        assert_valid("recommendation", r)
        answer = parse_answer(r)
        assert not isinstance(answer, str), answer
        assert (answer.source, answer.per_job_bytes) == (r["source"], r["per_job_bytes"])


@pytest.mark.slow
def test_the_api_s_answer_fits_the_schema(tmp_path: Path) -> None:
    """The whole answer of GET /api/v1/profiles/NAME/recommendation (the store adds the request's
    fields), from observations posted to a real manager on SQLite."""
    from oomguard.manager.app import create_app
    from oomguard.manager.db import migrate
    from oomguard.manager.settings import Settings
    from tests.helpers.manager import AGENT, AGENT_H, VIEWER, VIEWER_H, Clock, local_client, make_store

    url = f"sqlite:///{tmp_path / 'oomguard.db'}"
    migrate(url)
    store = make_store(url, Clock(NOW))
    settings = Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER, admin_token="admin-secret-token-1")
    with local_client(create_app(settings, store)) as c:
        path = "/api/v1/profiles/tiny/recommendation"
        answers = [c.get(path, headers=VIEWER_H).json()]
        for _ in range(3):
            body = {"node": "a1", "id": uuid.uuid4().hex, "observation": an_observation() | {"node_class": "l4"}}
            assert c.post("/api/v1/observations", json=body, headers=AGENT_H).status_code == 200
        for query in ({"node": "a1"}, {"node": "a9", "node_class": "l4"}, {"budget_bytes": str(GiB)}):
            r = c.get(path, params=query, headers=VIEWER_H)
            assert r.status_code == 200, r.text
            answers.append(r.json())
    assert [a["source"] for a in answers] == ["declared", "node", "class", "fleet"]
    for a in answers:
        assert_valid("recommendation", a)
        assert not isinstance(parse_answer(a), str)


BAD_RECOMMENDATIONS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "an unknown source": lambda r: r | {"source": "cluster"},
    "a source of another type": lambda r: r | {"source": 1},
    "a size as text": lambda r: r | {"per_job_bytes": "12GiB"},
    "a size as a float": lambda r: r | {"baseline_bytes": 1.5},
    "a negative size": lambda r: r | {"per_job_bytes": -1},
    "a size as a boolean": lambda r: r | {"per_job_bytes": True},
    "learned without a size": lambda r: r | {"per_job_bytes": None},
    "negative samples": lambda r: r | {"samples": -1},
    "samples as text": lambda r: r | {"samples": "3"},
    "a confidence as text": lambda r: r | {"confidence": "high"},
    "not an object": lambda r: [r],
}


@pytest.mark.parametrize("case", sorted(BAD_RECOMMENDATIONS))
def test_the_run_side_refuses_the_recommendations_the_schema_refuses(case: str) -> None:
    good = next(r for r in recommendations() if r["source"] == "node")
    assert_valid("recommendation", good)
    assert not isinstance(parse_answer(good), str)
    bad = BAD_RECOMMENDATIONS[case](dict(good))
    assert problems("recommendation", bad), f"the schema takes {case}"
    assert isinstance(parse_answer(bad), str), f"parse_answer takes {case}"
