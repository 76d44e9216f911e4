"""deploy/: the worker image, the systemd unit, the Kubernetes manifests and the Prometheus files,
checked offline as far as possible (no Docker engine, no cluster), and docs/operations.md's flags
and metric names against the real command line and the real /metrics."""

from __future__ import annotations

import argparse
import configparser
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from oomguard.cli import parse
from oomguard.errors import UsageError
from tests.conftest import REPO
from tests.helpers.wait import wait_until

DEPLOY = REPO / "deploy"
WORKER = DEPLOY / "worker"
K8S = DEPLOY / "k8s"
PROM = DEPLOY / "prometheus"
UNIT = DEPLOY / "systemd" / "oomguard-manager.service"
OPERATIONS = REPO / "docs" / "operations.md"
URL = "http://oomguard-manager.example:8080"


def secret_literal(text: str) -> str | None:
    """A secret committed by mistake: a token flag with a value, a long hex run (openssl rand
    -hex), or a long run mixing digits, upper and lower case letters (base64)."""
    if m := re.search(r"--(agent|viewer)-token[ =]\S+", text):
        return m[0]
    for run in re.findall(r"[A-Za-z0-9+/=_-]{32,}", text):
        assert isinstance(run, str)
        if re.fullmatch(r"[0-9a-fA-F]+", run) or (
            re.search(r"\d", run) and re.search(r"[a-z]", run) and re.search(r"[A-Z]", run)
        ):
            return run
    return None


# -- helpers ---------------------------------------------------------------------------------
def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path}: the last instruction ends in a backslash"
    return out


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and value and all(isinstance(v, str) for v in value), args
    return value


def env_of(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in instructions:
        if word == "ENV":
            for pair in shlex.split(args):
                key, eq, value = pair.partition("=")
                assert eq, f"ENV {args!r}: use KEY=VALUE"
                env[key] = value
    return env


def parses(command: str, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """*argv* through oomguard's own parser for *command* (UsageError on an unknown flag): the
    options, and the worker's command line for ``run``."""
    from oomguard.commands.run import worker_argv

    args = parse([command, *argv])
    return args, worker_argv(args) if command == "run" else []


@functools.cache
def help_flags(command: str) -> frozenset[str]:
    out = subprocess.run(
        [sys.executable, "-m", "oomguard", command, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    flags = frozenset(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z-]*)", out.stdout, re.M))
    assert "--help" in flags and len(flags) > 3, out.stdout
    return flags


def k8s_docs() -> list[tuple[Path, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc is not None, f"{path}: an empty YAML document"
            assert isinstance(doc, dict), f"{path}: a document that is not a mapping"
            docs.append((path, doc))
    return docs


WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")


def workloads() -> list[dict[str, Any]]:
    return [d for _, d in k8s_docs() if d["kind"] in WORKLOADS]


def containers(workload: dict[str, Any], init: bool = True) -> list[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    return list(spec.get("containers", [])) + (list(spec.get("initContainers", [])) if init else [])


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in k8s_docs() if d["kind"] == kind}


def manager_container() -> dict[str, Any]:
    found = [c for w in workloads() for c in containers(w) if c.get("command", [])[:2] == ["oomguard", "manager"]]
    assert len(found) == 1, "one container runs `oomguard manager`"
    return found[0]


def worker_container() -> tuple[dict[str, Any], dict[str, Any]]:
    for w in workloads():
        for c in containers(w, init=False):
            if any("{budget}" in a for a in c.get("args", [])):
                return w, c
    raise AssertionError("no worker container passes {budget}")


def env_value(container: dict[str, Any], name: str) -> Any:
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value", e.get("valueFrom"))
    raise KeyError(name)


QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "": 1}


def quantity(text: object) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|)", str(text))
    assert m, f"not a memory quantity: {text!r}"
    return int(m[1]) * QUANTITY[m[2]]


def secret_keys() -> dict[str, dict[str, str]]:
    out = {}
    for name, doc in by_kind("Secret").items():
        data = {**doc.get("data", {}), **doc.get("stringData", {})}
        out[name] = data
    return out


# -- the worker image ------------------------------------------------------------------------
def test_worker_dockerfile_instructions() -> None:
    ins = dockerfile(WORKER / "Dockerfile")
    words = [w for w, _ in ins]
    known = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "USER", "WORKDIR", "ENTRYPOINT", "CMD", "LABEL", "EXPOSE"}
    assert set(words) <= known, set(words) - known
    assert next(w for w in words if w != "ARG") == "FROM"
    assert words.count("ENTRYPOINT") == 1 and words.count("CMD") == 1
    entrypoint = exec_form(dict(ins)["ENTRYPOINT"])
    cmd = exec_form(dict(ins)["CMD"])
    assert "--budget" in cmd and "{budget}" in cmd, cmd
    users = [a for w, a in ins if w == "USER"]
    assert users and users[-1] not in ("root", "0"), "the worker runs unprivileged"
    # COPY sources exist in the build context (the repository root); dist/oomguard.pyz is what
    # `make pyz` makes (tests/integration/test_pyz.py builds and runs it).
    copies = {}
    for w, a in ins:
        if w == "COPY":
            parts = [p for p in shlex.split(a) if not p.startswith("--")]
            for src in parts[:-1]:
                copies[parts[-1]] = src
                if src == "dist/oomguard.pyz":
                    assert "$(DIST)/oomguard.pyz" in (REPO / "Makefile").read_text()
                else:
                    assert (REPO / src).exists(), f"COPY {src}: not in the build context"
    assert entrypoint[0] in copies, "the ENTRYPOINT is a file the image copies in"
    assert copies.get("/usr/local/bin/oomguard") == "dist/oomguard.pyz"
    # No secret in the image: no token variable set, no literal.
    env = env_of(ins)
    for key in env:
        assert not re.search(r"TOKEN|PASSWORD|SECRET", key), f"ENV {key} would bake a secret into the image"
    for w, a in ins:
        if w == "ARG":
            assert not re.search(r"TOKEN|PASSWORD|SECRET", a), f"ARG {a}: build args end up in the image history"
        assert secret_literal(a) is None, f"{w} {a}: looks like a secret literal"
    # The run flags the image sets are real `oomguard run` flags.
    values, positionals = parses("run", [*shlex.split(env["OOMGUARD_RUN_ARGS"]), "--", "w"])
    assert positionals == ["w"] and values.stop_timeout == "25s"


def _stub_bin(tmp_path: Path, run_body: str) -> Path:
    """A stub `oomguard` on PATH: it records its argv and environment, the agent waits for TERM."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "oomguard"
    stub.write_text(
        "#!/bin/sh\n"
        "cmd=$1\n"
        # The gate's one-shot report (agent --once) is recorded apart and done at once.
        'case "$cmd $*" in "agent "*" --once "*) printf "%s\\n" "$@" > "$STUB_DIR/agent-once.argv"; exit 0 ;; esac\n'
        # The agent's trap is in place before it says it is ready, so a TERM is never missed.
        'if [ "$cmd" = agent ]; then trap \'echo TERM > "$STUB_DIR/agent.signal"; exit 0\' TERM; fi\n'
        'printf "%s\\n" "$@" > "$STUB_DIR/$cmd.argv"\nenv > "$STUB_DIR/$cmd.env"\n'
        # the entrypoint's gate (check, plan, verify) passes
        'case "$cmd" in check|plan|verify) exit 0 ;; esac\n'
        'if [ "$cmd" = agent ]; then\n'
        '  : > "$STUB_DIR/agent.ready"\n'
        "  while :; do sleep 0.02; done\n"
        "fi\n"
        # `run` starts only once the agent is up, so the test sees both.
        'if [ "$OOMGUARD_AGENT" != off ]; then\n'
        '  i=0; while [ ! -e "$STUB_DIR/agent.ready" ] && [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done\n'
        "fi\n" + run_body
    )
    stub.chmod(0o755)
    return bin_dir


def _image_argv(cmd: list[str] | None = None) -> list[str]:
    """The container's argv (ENTRYPOINT + CMD), the entrypoint mapped to its file in deploy/."""
    ins = dockerfile(WORKER / "Dockerfile")
    entrypoint = exec_form(dict(ins)["ENTRYPOINT"])
    copies = {}
    for w, a in ins:
        if w == "COPY":
            parts = [p for p in shlex.split(a) if not p.startswith("--")]
            copies[parts[-1]] = parts[0]
    local = REPO / copies[entrypoint[0]]
    return [str(local), *entrypoint[1:], *(cmd if cmd is not None else exec_form(dict(ins)["CMD"]))]


def _image_env(tmp_path: Path, bin_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STUB_DIR": str(tmp_path),
        "HOME": str(tmp_path),
        **env_of(dockerfile(WORKER / "Dockerfile")),
        **extra,
    }
    return env


def test_worker_entrypoint_shell_syntax() -> None:
    script = WORKER / "entrypoint.sh"
    assert os.access(script, os.X_OK), "entrypoint.sh is executable"
    assert script.read_text().startswith("#!/bin/sh\n")
    proc = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    if shutil.which("dash") and shutil.which("bash"):  # Debian's /bin/sh and bash --posix
        for shell in (["dash", "-n"], ["bash", "--posix", "-n"]):
            proc = subprocess.run([*shell, str(script)], capture_output=True, text=True)
            assert proc.returncode == 0, (shell, proc.stderr)


def test_worker_entrypoint_runs_agent_and_run(tmp_path: Path) -> None:
    bin_dir = _stub_bin(tmp_path, "exit 3\n")
    (tmp_path / "token").write_text("tok-from-a-secret-file\n")
    env = _image_env(tmp_path, bin_dir, OOMGUARD_MANAGER=URL, OOMGUARD_AGENT_TOKEN_FILE=str(tmp_path / "token"))
    proc = subprocess.run(_image_argv(), env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3, proc.stderr  # `oomguard run`'s status (the worker's) is the container's
    run_argv = (tmp_path / "run.argv").read_text().splitlines()
    agent_argv = (tmp_path / "agent.argv").read_text().splitlines()
    assert run_argv == [
        "run",
        "--manager",
        URL,
        "--stop-timeout",
        "25s",
        "--",
        "example-worker",
        "--budget",
        "{budget}",
    ]
    passed = ["--gate", "check", "--gate-exit", "0", "--gate-message", "passed: check --require 1B"]
    assert agent_argv == ["agent", "--manager", URL, *passed]  # its first report says the gate passed
    assert (tmp_path / "agent.signal").read_text().strip() == "TERM", "the agent is stopped when run ends"
    # Real flags, as oomguard parses them: the worker's command line comes out whole.
    values, worker = parses("run", run_argv[1:])
    assert values.manager == URL and worker == ["example-worker", "--budget", "{budget}"]
    assert parses("agent", agent_argv[1:])[0].manager == URL
    # The token reaches both through the environment (command lines are public), command lines never.
    for name in ("run", "agent"):
        child_env = (tmp_path / f"{name}.env").read_text().splitlines()
        assert "OOMGUARD_AGENT_TOKEN=tok-from-a-secret-file" in child_env
        assert "OOMGUARD_SPOOL=/var/lib/oomguard/spool" in child_env
    assert "tok-from" not in " ".join(run_argv + agent_argv)


def test_worker_entrypoint_agent_off_execs_run(tmp_path: Path) -> None:
    bin_dir = _stub_bin(tmp_path, "exit 0\n")
    (tmp_path / "a.jsonl").write_text("")  # a glob in OOMGUARD_RUN_ARGS must stay a literal
    env = _image_env(
        tmp_path,
        bin_dir,
        OOMGUARD_MANAGER=URL,
        OOMGUARD_AGENT="off",
        OOMGUARD_NODE="gpu-07",
        OOMGUARD_RUN_ARGS="--profile porep-c2-32g --events *.jsonl",
        OOMGUARD_AGENT_TOKEN="t0",
    )
    worker = ["my-worker", "--budget", "{budget}", "--note", "two words"]
    proc = subprocess.run(_image_argv(worker), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "agent.argv").exists()  # no agent loop: the gate's pass is sent by a one-shot
    once = (tmp_path / "agent-once.argv").read_text().splitlines()
    assert once[:4] == ["agent", "--manager", URL, "--node"] and "--once" in once and "--gate" in once
    run_argv = (tmp_path / "run.argv").read_text().splitlines()
    assert run_argv == [
        "run",
        *("--manager", URL, "--node", "gpu-07", "--profile", "porep-c2-32g", "--events", "*.jsonl"),
        "--",
        *worker,
    ]
    values, positionals = parses("run", run_argv[1:])
    assert values.node == "gpu-07" and positionals == worker


def test_worker_entrypoint_forwards_term(tmp_path: Path) -> None:
    bin_dir = _stub_bin(
        tmp_path,
        "trap 'echo TERM > \"$STUB_DIR/run.signal\"; exit 143' TERM\n"
        'touch "$STUB_DIR/run.ready"\n'
        "while :; do sleep 0.02; done\n",
    )
    env = _image_env(tmp_path, bin_dir, OOMGUARD_MANAGER=URL)
    proc = subprocess.Popen(_image_argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready = tmp_path / "run.ready"
        wait_until(lambda: ready.exists() or proc.poll() is not None, what="run to start (or the image to exit)")
        assert ready.exists() and proc.poll() is None, "run never started"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "run.signal").read_text().strip() == "TERM"
    assert (tmp_path / "agent.signal").read_text().strip() == "TERM"


@pytest.mark.parametrize(
    ("extra", "argv", "message"),
    [
        ({}, None, "set OOMGUARD_MANAGER"),
        ({"OOMGUARD_MANAGER": URL}, [], "no worker command"),
        ({"OOMGUARD_MANAGER": URL, "OOMGUARD_AGENT_TOKEN_FILE": "/nonexistent/token"}, None, "cannot read"),
    ],
)
def test_worker_entrypoint_usage_errors(
    tmp_path: Path, extra: dict[str, str], argv: list[str] | None, message: str
) -> None:
    bin_dir = _stub_bin(tmp_path, "exit 0\n")
    proc = subprocess.run(
        _image_argv(argv), env=_image_env(tmp_path, bin_dir, **extra), capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("*.argv")), "oomguard was not started"


def test_example_worker_under_real_oomguard() -> None:
    """The pattern end to end, without the image: oomguard run passes the budget, the worker
    takes the smaller of it and its own detection."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "oomguard", "run", "--restart", "never", "--budget", "64MiB", "--"),
            *(sys.executable, str(WORKER / "example_worker.py"), "--budget", "{budget}", "--duration", "0.05"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "planning with 67108864 bytes (from oomguard --budget;" in proc.stdout, proc.stdout


def test_manager_dockerfile() -> None:
    ins = dockerfile(DEPLOY / "manager" / "Dockerfile")
    assert ins[0][0] == "FROM"
    assert exec_form(dict(ins)["ENTRYPOINT"]) == ["oomguard", "manager"]
    values, _ = parses("manager", exec_form(dict(ins)["CMD"]))
    assert values.host == "0.0.0.0"
    for w, a in ins:
        assert secret_literal(a) is None, f"{w} {a}"
        assert not (w in ("ENV", "ARG") and re.search(r"TOKEN|PASSWORD", a)), f"{w} {a}"


# -- systemd ---------------------------------------------------------------------------------
def _unit() -> configparser.RawConfigParser:
    cp = configparser.RawConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(UNIT.read_text())
    return cp


def test_systemd_unit_keys() -> None:
    unit = _unit()
    s = unit["Service"]
    assert quantity(s["MemoryMax"].replace("G", "Gi").replace("M", "Mi")) >= 256 * 2**20
    assert s["Restart"] == "on-failure"
    assert s.get("DynamicUser") == "yes" or s.get("User") not in (None, "root")
    assert s["StateDirectory"] == "oomguard"
    assert "EnvironmentFile" in s or "LoadCredential" in s
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
        "RestrictSUIDSGID": "yes",
    }.items():
        assert s.get(key) == value, f"{key}={s.get(key)!r}"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    argv = shlex.split(s["ExecStart"])
    assert Path(argv[0]).name == "oomguard" and argv[1] == "manager"
    values, _ = parses("manager", argv[2:])
    assert values.host == "127.0.0.1", "behind a TLS proxy: loopback only"
    assert values.db == "sqlite:///%S/oomguard/oomguard.db", "the database lives in the StateDirectory"
    assert not values.agent_token and not values.viewer_token, "tokens never on the command line"
    assert set(re.findall(r"--[a-z-]+", s["ExecStart"])) <= help_flags("manager")


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the unit was parsed, not verified")
    # verify checks that ExecStart's program exists: use this checkout's oomguard instead of /opt.
    exe = shutil.which("oomguard", path=str(Path(sys.executable).parent)) or "/bin/true"
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/oomguard/bin/oomguard", exe))
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if UNIT.name in line]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr
    # The sandbox: an exposure of at most 2.5 of 10 (--threshold counts tenths).
    sec = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=25", str(unit)], capture_output=True, text=True, timeout=60
    )
    if "--offline" in sec.stderr and "unrecognized" in sec.stderr:
        pytest.skip("systemd-analyze security --offline needs systemd >= 250 (verify passed)")
    assert sec.returncode == 0, sec.stdout[-2000:] + sec.stderr


# -- Kubernetes ------------------------------------------------------------------------------
def test_k8s_documents_parse_and_are_named() -> None:
    docs = k8s_docs()
    kinds = {d["kind"] for _, d in docs}
    assert {"Deployment", "StatefulSet", "Service", "Secret", "PersistentVolumeClaim"} - kinds == {
        "PersistentVolumeClaim"
    }, kinds  # the PVC comes from the StatefulSet's volumeClaimTemplates
    for path, d in docs:
        assert d.get("apiVersion") and d.get("kind"), path
        assert d.get("metadata", {}).get("name"), f"{path}: {d['kind']} without metadata.name"
    pvcs = by_kind("StatefulSet")["oomguard-postgres"]["spec"]["volumeClaimTemplates"]
    assert quantity(pvcs[0]["spec"]["resources"]["requests"]["storage"]) > 0
    names = [(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for _, d in docs]
    assert len(names) == len(set(names)), "no object is defined twice"


def test_k8s_containers_have_images_and_memory_limits() -> None:
    seen = 0
    for w in workloads():
        for c in containers(w):
            seen += 1
            where = f"{w['metadata']['name']}/{c['name']}"
            assert c.get("image"), where
            assert ":" in c["image"] and not c["image"].endswith(":latest"), f"{where}: pin the image's tag"
            limit = quantity(c["resources"]["limits"]["memory"])
            request = c["resources"].get("requests", {}).get("memory")
            assert limit > 0 and (request is None or quantity(request) <= limit), where
            assert c.get("securityContext", {}).get("allowPrivilegeEscalation") is False, where
    assert seen >= 4


def test_k8s_selectors_match_template_labels() -> None:
    for w in workloads():
        wanted = w["spec"]["selector"]["matchLabels"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert wanted and wanted.items() <= labels.items(), w["metadata"]["name"]
    services = by_kind("Service")
    for s in by_kind("StatefulSet").values():
        assert s["spec"]["serviceName"] in services


def test_k8s_services_select_pods_and_ports() -> None:
    for name, svc in by_kind("Service").items():
        sel = svc["spec"]["selector"]
        pods = [w for w in workloads() if sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(pods) == 1, f"Service {name} selects {len(pods)} workloads"
        port_names = {p.get("name") for c in containers(pods[0], init=False) for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in port_names, f"Service {name}: targetPort {p['targetPort']} is no container port"


def test_k8s_secret_refs_resolve() -> None:
    secrets = secret_keys()
    refs = 0
    for w in workloads():
        for c in containers(w):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs += 1
                    assert ref["key"] in secrets.get(ref["name"], {}), f"{c['name']}: {ref} is not defined"
    for sm in by_kind("ServiceMonitor").values():
        for ep in sm["spec"]["endpoints"]:
            cred = ep["authorization"]["credentials"]
            refs += 1
            assert cred["key"] in secrets.get(cred["name"], {}), cred
    assert refs >= 5
    # The example Secrets hold placeholders only, visibly so, and the two tokens differ.
    for name, data in secrets.items():
        for key, value in data.items():
            assert str(value).startswith("CHANGE-ME"), f"Secret {name}/{key}: not a marked placeholder"
    tokens = secrets["oomguard-tokens"]
    assert tokens["agent-token"] != tokens["viewer-token"]
    # No secret value is written into a manifest outside the example Secrets.
    for path in K8S.glob("*.yaml"):
        if path.name != "secrets.example.yaml":
            assert "CHANGE-ME" not in path.read_text() and secret_literal(path.read_text()) is None, path


def test_k8s_probes_tell_liveness_from_readiness() -> None:
    c = manager_container()
    ports = {p["name"] for p in c["ports"]}
    # Readiness asks /readyz (which checks the database); liveness and start-up ask /livez (the
    # process answers), so a database outage takes the pod out of rotation instead of restarting it.
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["readinessProbe"]["httpGet"]["port"] in ports
    assert c["livenessProbe"]["httpGet"]["path"] == c["startupProbe"]["httpGet"]["path"] == "/livez"
    for w in workloads():
        for other in containers(w):
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                if "httpGet" in other.get(kind, {}):
                    assert other[kind]["httpGet"]["path"] in ("/livez", "/readyz"), (other["name"], kind)


def test_k8s_manager_flags_are_real(monkeypatch: pytest.MonkeyPatch) -> None:
    """The manager's args against `oomguard manager --help` and through its real start-up checks
    (flags, port, durations, both tokens off loopback), stopped before it touches the database."""
    c = manager_container()
    args = c["args"]
    assert {a for a in args if a.startswith("--")} <= help_flags("manager")
    values, extra = parses("manager", args)
    assert not extra
    db = values.db
    assert isinstance(db, str) and db.startswith("postgresql://")
    userinfo, host = db.split("://", 1)[1].split("/", 1)[0].split("@")
    assert ":" not in userinfo, "no password in the URL (PGPASSWORD from a Secret)"
    assert env_value(c, "PGPASSWORD")["secretKeyRef"]["name"] in secret_keys()
    service, port = host.split(":")
    assert service in by_kind("Service") and int(port) in {
        p["port"] for p in by_kind("Service")[service]["spec"]["ports"]
    }

    pytest.importorskip("fastapi")
    from oomguard.manager.cli import manager_command
    from oomguard.manager.db import steps

    class Reached(Exception):
        pass

    def fake_upgrade(url: str, say: object) -> None:
        raise Reached(url)

    tokens = secret_keys()["oomguard-tokens"]
    monkeypatch.setattr(steps, "upgrade", fake_upgrade)
    monkeypatch.setenv("OOMGUARD_AGENT_TOKEN", tokens[env_value(c, "OOMGUARD_AGENT_TOKEN")["secretKeyRef"]["key"]])
    monkeypatch.setenv("OOMGUARD_VIEWER_TOKEN", tokens[env_value(c, "OOMGUARD_VIEWER_TOKEN")["secretKeyRef"]["key"]])
    with pytest.raises(Reached, match="postgresql://"):
        manager_command(values)
    # And without the tokens, the same flags are refused: the Secret is what makes them valid.
    monkeypatch.delenv("OOMGUARD_VIEWER_TOKEN")
    with pytest.raises(UsageError, match="without both"):
        manager_command(values)


def test_k8s_worker_keeps_the_entrypoint() -> None:
    w, c = worker_container()
    assert "command" not in c, "command would replace the image's ENTRYPOINT (oomguard-entrypoint)"
    assert "--budget" in c["args"] and "{budget}" in c["args"]
    manager = env_value(c, "OOMGUARD_MANAGER")
    m = re.fullmatch(r"http://([a-z0-9-]+)(?:\.([a-z0-9-]+)\.svc)?:(\d+)", manager)
    assert m, manager
    svc = by_kind("Service")[m[1]]
    assert m[2] in (None, svc["metadata"]["namespace"]) and int(m[3]) in {p["port"] for p in svc["spec"]["ports"]}
    assert "secretKeyRef" in env_value(c, "OOMGUARD_AGENT_TOKEN")
    values, _ = parses("run", [*shlex.split(env_value(c, "OOMGUARD_RUN_ARGS")), "--", "w"])
    stop = str(values.stop_timeout)
    assert stop.endswith("s") and int(stop[:-1]) < w["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert os.path.dirname(env_value(c, "OOMGUARD_SPOOL")) in mounts, "the spool is on a volume"


def test_k8s_worker_labels_its_node_with_the_kubernetes_node() -> None:
    """The downward API's spec.nodeName, in the variable oomguard reads for the k8s_node_name label."""
    from oomguard.agent.labels import ENV_LABELS, environment_labels

    _, c = worker_container()
    assert "K8S_NODE_NAME" in ENV_LABELS
    assert env_value(c, "K8S_NODE_NAME") == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert environment_labels({"K8S_NODE_NAME": "gke-pool-1-abcd"}) == {"k8s_node_name": "gke-pool-1-abcd"}


def test_k8s_service_monitor() -> None:
    (sm,) = by_kind("ServiceMonitor").values()
    services = [
        s
        for s in by_kind("Service").values()
        if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert len(services) == 1 and services[0]["metadata"]["name"] == "oomguard-manager"
    (ep,) = sm["spec"]["endpoints"]
    assert ep["path"] == "/metrics" and ep["authorization"]["type"] == "Bearer"
    assert ep["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
    assert ep["authorization"]["credentials"]["key"] == "viewer-token"


def test_k8s_kustomize_builds() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomization was parsed, not built")
    proc = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    built = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(proc.stdout)}
    assert {
        ("Deployment", "oomguard-manager"),
        ("StatefulSet", "oomguard-postgres"),
        ("Namespace", "oomguard"),
    } <= built


# -- Prometheus and the docs -----------------------------------------------------------------
def test_prometheus_rules_match_the_prometheusrule() -> None:
    rules = yaml.safe_load((PROM / "oomguard-rules.yml").read_text())
    (pr,) = by_kind("PrometheusRule").values()
    assert pr["spec"]["groups"] == rules["groups"], "deploy/prometheus and deploy/k8s carry the same rules"
    (scrape,) = yaml.safe_load((PROM / "scrape.yml").read_text())["scrape_configs"]
    assert scrape["metrics_path"] == "/metrics" and scrape["authorization"]["type"] == "Bearer"
    for rule in rules["groups"][0]["rules"]:
        assert rule["alert"] and rule["expr"].strip() and rule["labels"]["severity"] in ("warning", "critical")
        if "job=" in rule["expr"]:
            assert f'job="{scrape["job_name"]}"' in rule["expr"]


@pytest.fixture(scope="module")
def metric_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The metric names a real manager serves on /metrics (and /healthz, the probes' path)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from oomguard.manager.app import create_app
    from oomguard.manager.db import migrate
    from oomguard.manager.settings import Settings
    from tests.helpers.manager import AGENT_H, VIEWER, VIEWER_H, envelope, fixture_report

    url = f"sqlite:///{tmp_path_factory.mktemp('mgr') / 'oomguard.db'}"
    migrate(url)
    settings = Settings(db_url=url, agent_token=AGENT_H["Authorization"].split()[1], viewer_token=VIEWER)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        assert client.get("/healthz").status_code == 200
        assert client.post("/api/v1/reports", json=envelope("node-a", fixture_report()), headers=AGENT_H).is_success
        hot = fixture_report()  # a node at its limit: the working-set alert's series exists only while it lasts
        hot["memory"]["working_set_bytes"] = hot["memory"]["effective_bytes"]
        assert client.post("/api/v1/reports", json=envelope("node-hot", hot), headers=AGENT_H).is_success
        started = {"node": "node-run", "id": "s-1", "event": {"event": "start", "pid": 7}}  # a supervisor state
        assert client.post("/api/v1/events", json=started, headers=AGENT_H).is_success
        assert client.get("/metrics").status_code == 401, "/metrics needs the viewer token"
        resp = client.get("/metrics", headers=VIEWER_H)
        assert resp.status_code == 200
    names = set(re.findall(r"^(oomguard_\w+)[{ ]", resp.text, re.M))
    assert "oomguard_node_up" in names
    return names


def test_rules_and_docs_use_real_metric_names(metric_names: set[str]) -> None:
    for path in (PROM / "oomguard-rules.yml", K8S / "monitoring.yaml", OPERATIONS):
        used = set(re.findall(r"\boomguard_[a-z_]+[a-z]", path.read_text()))
        assert used, path
        assert used <= metric_names, f"{path}: {sorted(used - metric_names)} not on /metrics"
    for name in ("oomguard_memory_effective_bytes", "oomguard_budget_bytes", "oomguard_oom_kills_total"):
        assert name in OPERATIONS.read_text()


def test_operations_doc_flags_are_real() -> None:
    """Every flag docs/operations.md gives `oomguard manager|agent|run` is in that command's --help."""
    text = OPERATIONS.read_text()
    checked = 0
    for command in ("manager", "agent", "run"):
        known = help_flags(command)
        for m in re.finditer(rf"oomguard {command}\b([^\n`]*)", text):
            args = m[1].split(" -- ")[0]  # after --, the worker's own flags
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", args):
                checked += 1
                assert flag in known, f"docs/operations.md: oomguard {command} {flag} is no such flag"
    assert checked >= 10
    for path in re.findall(r"\(\.\./(deploy/[^)#]+)\)", text):
        assert (REPO / path).exists(), f"docs/operations.md links to {path}, which does not exist"
