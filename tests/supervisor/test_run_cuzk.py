"""``run --cuzk`` and ``run --render``: config files written before each start (supervisor/cuzk.py,
supervisor/templates.py), without a cgroup; the real one is tests/integration/test_run_cuzk_cgroup.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from oomguard.errors import UsageError
from oomguard.policy.plan import Shape
from oomguard.supervisor import cuzk
from oomguard.supervisor.config import RunConfig, cuzk_output, worker_values
from oomguard.supervisor.templates import Rendered, write_atomic
from tests.helpers.fuzz import examples
from tests.helpers.mounts import tmpfs
from tests.helpers.paths import REPO

tomllib = pytest.importorskip("tomllib", reason="TOML is read by tomllib: Python >= 3.11")

GiB = 1 << 30
MiB = 1 << 20
EXAMPLE = """# cuzk daemon configuration
[daemon]
listen = "0.0.0.0:9820"
# status_listen = "0.0.0.0:9821"

[memory]
# "auto" = detect from /proc/meminfo MemTotal - safety_margin (recommended).
total_budget = "auto"

# Safety margin subtracted from total_budget when using "auto".
safety_margin = "5GiB"
eviction_min_idle = "5m"

[gpus]
devices = [0, 1]
"""


# -- CuZK's size parser, ported ------------------------------------------------------------


def test_parse_size_is_cuzks() -> None:
    # CuZK's own unit test (config.rs L503-508)
    assert cuzk.parse_size("50GiB") == 50 * GiB
    assert cuzk.parse_size("140GiB") == 140 * GiB
    assert cuzk.parse_size("626MiB") == 626 * MiB
    # the rest of L482-497: GB and MB, bytes, spaces trimmed around the number and the unit
    assert cuzk.parse_size("2GB") == 2_000_000_000 and cuzk.parse_size("3MB") == 3_000_000
    assert cuzk.parse_size(" 12 GiB ") == 12 * GiB and cuzk.parse_size("+5") == 5
    assert cuzk.parse_size("368293445632") == 368293445632
    # what it silently turns into its defaults: 50 GiB (GiB, GB, bytes), 0 (MiB, MB)
    for text in ("300.5GiB", "1TiB", "auto", "", "1_000", "1e9", "-1", "\u0663GiB", "18446744073709551616"):
        assert cuzk.parse_size(text) == 50 * GiB, text
    assert cuzk.parse_size("10.5MiB") == 0 and cuzk.parse_size("xMB") == 0
    assert cuzk.parse_size("18446744073709551615GiB") == (((1 << 64) - 1) * GiB) % (1 << 64)  # u64 wraps
    assert cuzk.parse_size("\x1c5") == 50 * GiB  # U+001C is not Rust's whitespace (it is Python's)


@given(st.text())
@settings(max_examples=examples(500))
def test_parse_size_takes_any_text(text: str) -> None:
    assert 0 <= cuzk.parse_size(text) < 1 << 64


# -- the config edit ---------------------------------------------------------------------


def test_total_budget_is_set_and_all_else_kept() -> None:
    out, note = cuzk.set_total_budget(EXAMPLE, 300 * GiB, tomllib.loads)
    assert note == f"total_budget = {300 * GiB} (300 GiB)"
    assert tomllib.loads(out) == {**tomllib.loads(EXAMPLE), "memory": {**tomllib.loads(EXAMPLE)["memory"],
                                                                        "total_budget": str(300 * GiB)}}  # fmt: skip
    before, after = EXAMPLE.splitlines(), out.splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert changed == [
        ('total_budget = "auto"', f'total_budget = "{300 * GiB}"  # set by oomguard run before each start: bytes')
    ]
    assert cuzk.parse_size(tomllib.loads(out)["memory"]["total_budget"]) == 300 * GiB  # what CuZK reads


def test_total_budget_added_under_the_header_and_line_endings_kept() -> None:
    out, _ = cuzk.set_total_budget("[memory]\r\nsafety_margin = '5GiB'\r\n[gpus]\r\n", 7, tomllib.loads)
    mark = "  # set by oomguard run before each start: bytes"
    assert out == f"[memory]\r\ntotal_budget = \"7\"{mark}\r\nsafety_margin = '5GiB'\r\n[gpus]\r\n"
    out, _ = cuzk.set_total_budget("[memory]", 7, tomllib.loads)  # the header is the last line
    assert tomllib.loads(out) == {"memory": {"total_budget": "7"}}


def test_an_explicit_lower_budget_is_kept_a_higher_one_replaced() -> None:
    text = '[memory]\ntotal_budget = "200GiB"\n'
    out, note = cuzk.set_total_budget(text, 300 * GiB, tomllib.loads)
    assert tomllib.loads(out)["memory"]["total_budget"] == str(200 * GiB)
    assert "'200GiB' is below the budget" in note
    out, _ = cuzk.set_total_budget(text, 150 * GiB, tomllib.loads)
    assert tomllib.loads(out)["memory"]["total_budget"] == str(150 * GiB)
    # a size CuZK cannot parse reads as 50 GiB there, so that is what the operator asked for
    out, _ = cuzk.set_total_budget('[memory]\ntotal_budget = "1TiB"\n', 300 * GiB, tomllib.loads)
    assert tomllib.loads(out)["memory"]["total_budget"] == str(50 * GiB)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[memory\n", "not TOML"),
        ("[daemon]\nlisten = '1'\n", "no [memory] table"),
        ("memory = { total_budget = 'auto' }\n", "no [memory] table header"),
        ("memory.total_budget = 'auto'\n", "no [memory] table header"),
        ('[memory]\ntotal_budget = """\nauto"""\n', "cannot set total_budget by a line edit"),
        ("[x]\ns = '''\n[memory]\n'''\n[memory]\n", "cannot set total_budget by a line edit"),
        ("[memory]\ntotal_budget = 50\n", None),  # a bare integer (CuZK refuses it): a string now
    ],
)
def test_templates_that_cannot_be_edited(text: str, why: str | None) -> None:
    if why is None:  # the operator's 50 bytes is an explicit value: kept where lower, quoted either way
        assert tomllib.loads(cuzk.set_total_budget(text, 9, tomllib.loads)[0])["memory"]["total_budget"] == "9"
        assert tomllib.loads(cuzk.set_total_budget(text, 99, tomllib.loads)[0])["memory"]["total_budget"] == "50"
        return
    with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
        cuzk.set_total_budget(text, 9, tomllib.loads)


def test_without_a_toml_parser_the_line_edit_alone() -> None:
    """Python 3.10 has no tomllib: the same line edit, without the parse before and after."""
    out, _ = cuzk.set_total_budget(EXAMPLE, 300 * GiB, None)
    assert out == cuzk.set_total_budget(EXAMPLE, 300 * GiB, tomllib.loads)[0]
    assert cuzk.set_total_budget('[memory]\ntotal_budget = "2GiB"\n', 3 * GiB, None)[1].endswith("is kept")
    with pytest.raises(ValueError, match="no \\[memory\\] table header"):
        cuzk.set_total_budget("[daemon]\n", 1, None)


@given(st.text(max_size=300), st.integers(0, (1 << 63) - 1))
@example('[memory]\ntotal_budget = "auto"\n', 1)
@settings(max_examples=examples(300))
def test_any_template_is_edited_exactly_or_refused(text: str, budget: int) -> None:
    """Any text: a ValueError, or a config that differs from it by exactly total_budget, which CuZK reads
    as at most the budget."""
    try:
        out, _ = cuzk.set_total_budget(text, budget, tomllib.loads)
    except ValueError:
        return
    got, want = tomllib.loads(out), tomllib.loads(text)
    value = got["memory"].pop("total_budget")
    want["memory"].pop("total_budget", None)
    assert got == want
    assert isinstance(value, str) and value.isdigit() and cuzk.parse_size(value) <= budget


# -- placeholders and the command line ---------------------------------------------------


def test_total_budget_bytes_follows_the_step_downs() -> None:
    shape = Shape(14 * GiB, 70 * GiB, max_jobs=18)
    # 300 GiB: CuZK runs (300 - 70) / 14 = 16 partitions from the whole budget, 11 from the jobs' share
    assert worker_values(300 * GiB, 16, shape, planned=16)["total_budget_bytes"] == str(300 * GiB)
    assert (300 * GiB - 70 * GiB) // (14 * GiB) == 16 and (230 * GiB - 70 * GiB) // (14 * GiB) == 11
    # two OOM step-downs: 14 jobs, and CuZK's own arithmetic on the value gives 14 too
    total = int(worker_values(300 * GiB, 14, shape, planned=16)["total_budget_bytes"])
    assert total == 272 * GiB and (total - 70 * GiB) // (14 * GiB) == 14
    assert worker_values(5 * GiB, None, None)["total_budget_bytes"] == str(5 * GiB)  # no plan: the budget


def test_cuzk_command_line(tmp_path: Path) -> None:
    template = tmp_path / "cuzk.toml"
    template.write_text(EXAMPLE)
    assert cuzk_output(str(template)) == str(tmp_path / "cuzk.oomguard.toml")
    assert cuzk_output("/etc/cuzk/config") == "/etc/cuzk/config.oomguard"
    config = RunConfig(["cuzk-daemon", "--log-level", "info"], cuzk=(str(template), None))
    assert config.command == ["cuzk-daemon", "--config", str(tmp_path / "cuzk.oomguard.toml"), "--log-level", "info"]
    for own in (["-c", "x"], ["--config", "x"], ["--config=x"], ["-cx"]):
        with pytest.raises(UsageError, match="remove --config from the worker's command"):
            RunConfig(["cuzk-daemon", *own], cuzk=(str(template), None))


def test_budget_flag_kept_only_where_help_lists_it(tmp_path: Path) -> None:
    old = tmp_path / "patched-daemon"  # a build that added --budget
    old.write_text("#!/bin/sh\necho '  -c, --config <CONFIG>'\necho '      --budget <BYTES>  memory budget'\n")
    public = tmp_path / "cuzk-daemon"
    public.write_text("#!/bin/sh\necho '  -c, --config <CONFIG>'\necho '      --budget-ish nothing'\n")
    old.chmod(0o755)
    public.chmod(0o755)
    assert cuzk.accepts_flag(str(old)) is True
    assert cuzk.accepts_flag(str(public)) is False  # --budget-ish is not --budget
    assert cuzk.accepts_flag(str(tmp_path / "missing")) is None
    kept, said = cuzk.without_budget_flag([str(old), "--budget", "9"])
    assert kept == [str(old), "--budget", "9"] and said is not None and "accepts --budget" in said
    for cmd in ([str(public), "--budget", "9", "-l", "x"], [str(public), "--budget=9", "-l", "x"]):
        dropped, said = cuzk.without_budget_flag(cmd)
        assert dropped == [str(public), "-l", "x"] and said is not None and "has no --budget flag" in said
    assert cuzk.without_budget_flag([str(public), "-l", "x"]) == ([str(public), "-l", "x"], None)


# -- the files ---------------------------------------------------------------------------


def test_write_atomic_replaces_and_keeps_the_templates_mode(tmp_path: Path) -> None:
    template, out = tmp_path / "app.conf.in", tmp_path / "app.conf"
    template.write_text('budget={budget_bytes} jobs={concurrency}\nliteral={{budget}} json={"a": 1}\n')
    template.chmod(0o640)
    out.write_text("old")
    from oomguard.supervisor.config import fill_text

    r = Rendered(str(template), str(out), "--render", fill_text(str(template)))
    r.write({"budget_bytes": "42", "concurrency": "3"})
    assert out.read_text() == 'budget=42 jobs=3\nliteral={budget} json={"a": 1}\n'
    assert out.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".oomguard-")] == []  # no temp file left
    with pytest.raises(UsageError, match="is the template itself"):
        Rendered(str(template), str(template), "--render", fill_text(str(template)))
    with pytest.raises(OSError):
        write_atomic(str(tmp_path / "missing-dir" / "x"), "y")


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A read-only file system (a tmpfs mounted ro) holding a CuZK template: a Kubernetes ConfigMap."""
    with tmpfs(tmp_path / "ro", "1m") as where:
        (where / "cuzk.toml").write_text(EXAMPLE)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_")} | {"PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "oomguard", "run", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )


def _script(path: Path, body: str) -> str:
    """An executable shell script (not ``sh -c``: ``-c`` is CuZK's --config to ``run --cuzk``)."""
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_bad_templates_exit_2_and_start_nothing(tmp_path: Path, read_only_dir: Path) -> None:
    marker = tmp_path / "started"
    worker = ["--", "/bin/sh", "-c", f"touch {marker}"]
    (tmp_path / "not.toml").write_text("[memory\n")
    (tmp_path / "nomem.toml").write_text("[daemon]\n")
    (tmp_path / "ok.toml").write_text(EXAMPLE)
    (tmp_path / "typo.in").write_text("x={budjet_bytes}\n")
    cases = {
        ("--cuzk", str(tmp_path / "missing.toml")): "cannot read",
        ("--cuzk", str(tmp_path / "not.toml")): "not TOML",
        ("--cuzk", str(tmp_path / "nomem.toml")): "no [memory] table",
        ("--cuzk", str(tmp_path)): "not a regular file",
        ("--cuzk", str(read_only_dir / "cuzk.toml")): "cannot write in",  # beside a read-only template
        ("--cuzk-out", str(tmp_path / "x.toml")): "--cuzk-out needs --cuzk",
        ("--render", str(tmp_path / "typo.in"), str(tmp_path / "out")): "did you mean {budget_bytes}",
        ("--render", str(tmp_path / "ok.toml"), str(tmp_path)): "is a directory",
    }
    for args, why in cases.items():
        line = _one_line(_run(*args, *worker, cwd=tmp_path))
        assert why in line, (args, line)
        assert not marker.exists(), args
    # the read-only directory holds the template; the config goes where --cuzk-out says
    out = tmp_path / "written.toml"
    cmd = ["--restart", "never", "--cuzk", str(read_only_dir / "cuzk.toml"), "--cuzk-out", str(out)]
    proc = _run(*cmd, "--", _script(tmp_path / "cuzk-daemon", 'echo "$@"'), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["--config", str(out)]
    assert cuzk.parse_size(tomllib.loads(out.read_text())["memory"]["total_budget"]) > 0


def test_render_fills_placeholders_in_any_file(tmp_path: Path) -> None:
    template, out = tmp_path / "app.json.in", tmp_path / "app.json"
    template.write_text('{"memory": {budget_bytes}, "total": {total_budget_bytes}, "jobs": {concurrency}}\n')
    proc = _run(
        "--restart", "never", "--budget", "3GiB", "--per-job", "1GiB", "--render", str(template), str(out),
        "--", "/bin/sh", "-c", f"cat {out}", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"memory": 3 * GiB, "total": 3 * GiB, "jobs": 3}
    assert f"--render: rendered -> {out}" in proc.stderr


def test_a_failed_write_at_a_restart_stops_the_run(tmp_path: Path) -> None:
    """The worker removes its template and fails: the restart cannot write the config, so it starts nothing
    (a stale file would hold the earlier, larger budget): a give-up event and one line, exit 2."""
    template, events = tmp_path / "cuzk.toml", tmp_path / "events.jsonl"
    template.write_text(EXAMPLE)
    proc = _run(
        "--backoff-initial", "0.05s", "--events", str(events), "--cuzk", str(template),
        "--", _script(tmp_path / "cuzk-daemon", f'echo started; rm "{template}"; exit 1'), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.count("started") == 1
    kinds = [json.loads(x)["event"] for x in events.read_text().splitlines()]
    assert kinds == ["start", "exit", "restart", "give-up"]
    assert proc.stderr.strip().splitlines()[-1].startswith("oomguard: error: --cuzk: cannot read")


def test_run_says_a_templates_lower_budget_was_kept(tmp_path: Path) -> None:
    template = tmp_path / "cuzk.toml"
    template.write_text('[memory]\ntotal_budget = "1GiB"\n')
    proc = _run(
        "--restart", "never", "--budget", "3GiB", "--cuzk", str(template),
        "--", _script(tmp_path / "cuzk-daemon", "true"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if "--cuzk:" in x)
    assert f"total_budget = {GiB} (1 GiB): the template's '1GiB' is below the budget {3 * GiB} and is kept" in line
    written = tomllib.loads((tmp_path / "cuzk.oomguard.toml").read_text())
    assert written["memory"]["total_budget"] == str(GiB)
