"""The command line: output forms, exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

from oomguard import errors
from oomguard._version import __version__
from oomguard.cli import COMMANDS, main
from oomguard.commands.render import to_json
from oomguard.errors import (
    EXIT_CODES,
    EXIT_OK,
    EXIT_VERIFY_FAILED,
    CommandNotFoundError,
    ThresholdError,
    UsageError,
    VerifyFailedError,
    exit_codes_help,
    exit_codes_markdown,
)
from tests.conftest import REPO, run_oomguard
from tests.helpers.trees import make_tree

pytestmark = pytest.mark.usefixtures("clean_env")


def test_check_json_is_one_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--json", "--root", str(make_tree(tmp_path))]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema_version"] == 1
    assert report["memory"]["effective_bytes"] == 536870912
    assert report["memory"]["limited_by"] == "cgroup-v2"
    # 512 MiB basis: margin = max(256 MiB, 10%) = 256 MiB
    assert report["budget"] == {
        "bytes": 268435456,
        "source": "auto",
        "basis_bytes": 536870912,
        "safety_margin_bytes": 268435456,
        "requested": "auto",
    }


def test_check_human_names_the_binding_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--root", str(make_tree(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "512 MiB" in out and "cgroup-v2 limit binds" in out
    assert "/sys/fs/cgroup/memory.max" in out
    # a private v2 cgroup namespace: what is above its root cannot be seen, said beside the limit too
    assert "may be lower: a limit above the cgroup namespace root cannot be seen" in out
    assert "Warnings (1)\n  limit-may-be-hidden: " in out


@pytest.mark.parametrize(
    ("args", "env", "want_bytes", "want_source"),
    [
        (["--budget", "300MiB"], "", 300 * 2**20, "explicit"),
        (["--budget", "50%"], "", 256 * 2**20, "explicit"),
        ([], "OOMGUARD_BUDGET=100M\0", 100 * 2**20, "env"),
        (["--budget", "200M"], "OOMGUARD_BUDGET=100M\0", 200 * 2**20, "explicit"),  # flag beats env
        (["--budget", "auto"], "OOMGUARD_BUDGET=100M\0", 256 * 2**20, "auto"),
        (["--margin", "100MiB"], "", 412 * 2**20, "auto"),
        (["--margin", "25%"], "", 384 * 2**20, "auto"),
    ],
)
def test_budget_precedence(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    env: str,
    want_bytes: int,
    want_source: str,
) -> None:
    assert main(["check", "--json", "--root", str(make_tree(tmp_path, env=env)), *args]) == 0
    budget = json.loads(capsys.readouterr().out)["budget"]
    assert (budget["bytes"], budget["source"]) == (want_bytes, want_source)
    assert (budget["safety_margin_bytes"] is None) == (want_source != "auto")


def test_explicit_budget_above_limit_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--json", "--root", str(make_tree(tmp_path)), "--budget", "1GiB"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["budget"]["bytes"] == 2**30  # kept: the operator's override
    assert [w["code"] for w in report["warnings"]] == ["limit-may-be-hidden", "budget-exceeds-limit"]


def test_require(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(make_tree(tmp_path))
    assert main(["check", "--root", root, "--require", "256MiB"]) == 0
    assert main(["check", "--root", root, "--require", "257MiB"]) == 3
    assert "--require: budget 256 MiB is below the required 257 MiB" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["check", "--budget", "lots"], "", "oomguard: error: --budget: invalid size 'lots'"),
        (["check", "--margin", "5X"], "", "oomguard: error: --margin: invalid size '5X'"),
        (["check", "--require=-1"], "", "oomguard: error: --require: -1 is negative"),
        (["check", "--budget", "-5GiB"], "", "oomguard: error: --budget: -5GiB is negative (a size is 0 or more)"),
        (["check", "--margin=-1.5G"], "", "oomguard: error: --margin: -1.5G is negative"),
        (["check"], "OOMGUARD_BUDGET=much\0", "oomguard: error: OOMGUARD_BUDGET: invalid size 'much'"),
        (["check", "--bogus"], "", "oomguard: error: check: unknown option --bogus (see 'oomguard check --help')"),
        (["check", "--bogus=1"], "", "oomguard: error: check: unknown option --bogus (see"),
        (["check", "--budget"], "", "oomguard: error: check: --budget needs a value"),
        (["check", "--json=yes"], "", "oomguard: error: check: --json takes no value"),
        (["check", "--probe"], "", "oomguard: error: check: ambiguous option: --probe could match --probe-mlock,"),
        (["check", "extra"], "", "oomguard: error: check: unexpected argument 'extra'"),
        (["frobnicate"], "", "oomguard: error: unknown command 'frobnicate' (commands: check, plan, verify, run,"),
        (["--frobnicate"], "", "oomguard: error: unknown option --frobnicate (see 'oomguard --help')"),
        (["check", "--probe-mlock", "1M"], "", "oomguard: error: check: --probe-mlock and --probe-pinned lock memory"),
        (["run", "--restart", "often", "--", "true"], "", "oomguard: error: --restart: expected one of on-failure,"),
        (["run", "--isolate=1", "--", "true"], "", "oomguard: error: run: --isolate takes no value"),
        (["capture"], "", "oomguard: error: capture: missing FILE.tar.gz"),
        (["completion", "fish"], "", "oomguard: error: SHELL: expected one of bash, zsh, got 'fish'"),
        (["completion"], "", "oomguard: error: completion: the following arguments are required: SHELL"),
    ],
)
def test_usage_errors_are_one_line_exit_2(tmp_path: Path, args: list[str], env: str, message: str) -> None:
    tree = make_tree(tmp_path, env=env)
    full = [*args, "--root", str(tree)] if args[0] == "check" else args
    proc = run_oomguard(*full)
    assert proc.returncode == 2, proc
    assert proc.stdout == ""
    assert proc.stderr.startswith(message), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_flag_equals_value_and_abbreviations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's conventions: --flag=value, and any unambiguous prefix of a long option."""
    root = str(make_tree(tmp_path))
    for argv in (["--budget=300MiB"], ["--bud", "300MiB"], ["--bud=300MiB"]):
        assert main(["check", "--js", f"--root={root}", *argv]) == 0, argv
        assert json.loads(capsys.readouterr().out)["budget"]["bytes"] == 300 * 2**20, argv


@pytest.mark.parametrize("kind", ["missing", "corrupt", "empty-dir", "not-gzip"])
def test_bad_snapshot_exit_2(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "snap.tar.gz"
    if kind == "corrupt":
        target.write_bytes(b"\x1f\x8b\x08\x00garbage" * 10)
    elif kind == "empty-dir":
        target = tmp_path / "empty"
        target.mkdir()
    elif kind == "not-gzip":
        target.write_text("hello")
    proc = run_oomguard("check", "--root", str(target))
    assert proc.returncode == 2
    assert proc.stderr.startswith("oomguard: error: --root: ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_tarball_without_probe_files_is_not_a_snapshot(tmp_path: Path) -> None:
    target = tmp_path / "other.tar.gz"
    (tmp_path / "readme").write_text("hi")
    with tarfile.open(target, "w:gz") as tar:
        tar.add(tmp_path / "readme", "readme")
    proc = run_oomguard("check", "--root", str(target))
    assert proc.returncode == 2 and "is not a snapshot" in proc.stderr


def test_help_and_version() -> None:
    top = run_oomguard("--help")
    assert top.returncode == 0 and top.stderr == ""
    assert top.stdout.startswith("usage: oomguard COMMAND [OPTIONS]\n")
    for name, brief in COMMANDS.items():  # every command, with its one-line brief
        assert f"\n  {name:<11} {brief}\n" in top.stdout, name
    assert exit_codes_help() in top.stdout
    sub = run_oomguard("check", "--help")
    assert sub.returncode == 0 and sub.stdout.startswith("usage: oomguard check [--json]")
    assert "--require SIZE" in sub.stdout and "  3   a threshold" in sub.stdout
    assert "budget options:" in sub.stdout and "--budget SPEC" in sub.stdout and "PCT% of the" in sub.stdout
    assert run_oomguard("help", "check").stdout == sub.stdout
    bare = run_oomguard()
    assert bare.returncode == 2 and bare.stdout == top.stdout
    version = run_oomguard("--version")
    assert version.returncode == 0 and version.stdout == f"oomguard {__version__}\n"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_help_ends_with_the_exit_codes(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: oomguard {command} ")
    assert out.rstrip("\n").endswith(exit_codes_help())


def test_exit_code_table_is_complete_and_ordered() -> None:
    constants = {name: v for name, v in vars(errors).items() if name.startswith("EXIT_") and isinstance(v, int)}
    codes = [code for code, _ in EXIT_CODES]
    assert sorted(constants.values()) == codes, "every EXIT_* constant once, in order"
    assert all(meaning and "\n" not in meaning for _, meaning in EXIT_CODES)
    for cls, code in ((UsageError, 2), (ThresholdError, 3), (VerifyFailedError, 4), (CommandNotFoundError, 127)):
        assert cls.exit_code == code and code in codes, cls


def test_readme_exit_codes_table_is_the_generated_one() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Exit codes\n\n", 1)[1].split("\n\n", 1)[0]
    assert section == exit_codes_markdown()
    assert readme.count("| code | meaning |") == 1, "one exit-code table in the README"


def test_live_check_exits_0_and_reports_a_ceiling() -> None:
    proc = run_oomguard("check", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    mem = report["memory"]
    assert mem["effective_bytes"] > 0
    assert mem["effective_bytes"] <= mem["host_total_bytes"]
    assert report["budget"]["bytes"] < mem["effective_bytes"]


def test_check_imports_only_its_own_command() -> None:
    """`check` loads neither the heavy modules (start-up time, bench/startup.py) nor another command."""
    code = (
        "import io, sys, runpy, contextlib; sys.argv = ['oomguard', 'check', '--json']\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        runpy.run_module('oomguard', run_name='__main__')\n"
        "    except SystemExit as e:\n        assert e.code == 0, e.code\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    proc = run_oomguard_code(code)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert {"oomguard.cli", "oomguard.commands.check", "oomguard.policy.budget"} <= loaded  # it really ran
    heavy = ("subprocess", "tarfile", "oomguard.manager", "oomguard.supervisor", "oomguard.agent", "fastapi")
    assert not [m for m in loaded if m.startswith(heavy)]
    commands = {m for m in loaded if m.startswith("oomguard.commands.")}
    assert commands == {"oomguard.commands.check", "oomguard.commands.flags", "oomguard.commands.render"}


@pytest.mark.parametrize("form", [["--"], []], ids=["after --", "first positional"])
def test_run_passes_the_command_through(tmp_path: Path, form: list[str]) -> None:
    """The worker's command line reaches it untouched, options that look like oomguard's included."""
    out = tmp_path / "argv"
    script = f'printf "%s\\n" "$@" > {out}; exit 3'
    proc = run_oomguard(
        "run", "--budget", "1GiB", "--restart", "never", *form, "sh", "-c", script, "sh", "-c", "--budget", "--", "x y"
    )
    assert proc.returncode == 3, proc.stderr
    assert out.read_text().splitlines() == ["-c", "--budget", "--", "x y"]


def test_agent_once_maps_only_usage_errors_to_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A bug in the probe or the agent is not a "usage error": it propagates (no exit 2 that hides it)."""
    import oomguard.agent

    def bug(**_: object) -> int:
        raise ValueError("a bug, not the user's fault")

    def usage(**_: object) -> int:
        raise UsageError("--manager: not an http(s) URL")

    argv = ["agent", "--once", "--manager", "http://127.0.0.1:9", "--spool", str(tmp_path), "--no-gpu"]
    monkeypatch.setattr(oomguard.agent, "run_agent", bug)
    with pytest.raises(ValueError, match="a bug"):
        main(argv)
    monkeypatch.setattr(oomguard.agent, "run_agent", usage)
    assert main(argv) == 2


def test_verify_not_delivered_exits_4(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from oomguard.verify import runner

    argv = ["verify", "--json", "--root", str(make_tree(tmp_path))]
    for delivered, code in ((True, EXIT_OK), (False, EXIT_VERIFY_FAILED)):
        monkeypatch.setattr(runner, "verify", lambda *a, d=delivered, **k: {"delivered": d})
        assert main(argv) == code
        assert json.loads(capsys.readouterr().out) == {"delivered": delivered}


def test_manager_missing_from_the_build_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "oomguard.manager.cli", None)  # as in the worker zipapp: no manager/
    assert main(["manager"]) == 2
    assert capsys.readouterr().err == (
        "oomguard: error: manager: not in this build (the worker zipapp): pip install 'oomguard[manager]'\n"
    )


def test_json_output_is_json_dumps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--json", "--root", str(make_tree(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert out == json.dumps(json.loads(out), indent=2) + "\n"
    assert to_json({"x": float("nan"), "y": [float("inf")]}) == json.dumps({"x": None, "y": [None]}, indent=2)


def run_oomguard_code(code: str):  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(REPO / 'src')!r})\n" + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def _can_drop_ipc_lock() -> str | None:
    """Why the failing-mlock test cannot run here, or None (it needs prlimit and setpriv, util-linux)."""
    import shutil

    missing = [tool for tool in ("prlimit", "setpriv") if shutil.which(tool) is None]
    return f"needs {' and '.join(missing)} (util-linux)" if missing else None


def test_probe_mlock_result_is_printed_and_a_failure_warns() -> None:
    """A real mlock of 64 MiB under a 1 MiB RLIMIT_MEMLOCK without CAP_IPC_LOCK fails: shown and warned."""
    import subprocess

    why = _can_drop_ipc_lock()
    if why:
        pytest.skip(why)
    cmd = ["prlimit", "--memlock=1048576", "setpriv", "--bounding-set=-ipc_lock", "--", sys.executable, "-m"]
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    human = subprocess.run(
        [*cmd, "oomguard", "check", "--probe-mlock", "64MiB"], capture_output=True, text=True, env=env
    )
    assert human.returncode == 0, human.stderr
    assert "  mlock probe      64 MiB         FAILED: Cannot allocate memory\n" in human.stdout
    assert "pin-probe-failed: mlock of 64 MiB failed in the probe child: Cannot allocate memory" in human.stdout
    ok = subprocess.run([*cmd, "oomguard", "check", "--probe-mlock", "512KiB", "--json"], capture_output=True, env=env)
    report = json.loads(ok.stdout)
    assert report["memlock"]["probe"]["ok"] is True and report["memlock"]["probe"]["bytes"] == 512 * 1024
    assert "pin-probe-failed" not in [w["code"] for w in report["warnings"]]


def test_verify_of_a_plan_that_fits_no_job_says_so_and_exits_3(tmp_path: Path) -> None:
    """Issue #14: "fits 0 jobs" instead of "DELIVERED: 0 B of 0 B" (nothing is allocated)."""
    proc = run_oomguard("verify", "--root", str(make_tree(tmp_path)), "--per-job", "1GiB", "--hold", "0.1")
    assert proc.returncode == 3, proc
    assert proc.stdout == ""
    assert proc.stderr.startswith("oomguard: error: verify: the plan fits 0 jobs (0 jobs, memory binds: ")
    assert proc.stderr.endswith("): nothing to verify\n") and "DELIVERED" not in proc.stderr


def test_a_bad_parameter_names_the_parameter_in_the_api_and_the_flag_on_the_command_line() -> None:
    """click's BadParameter habit: policy, supervisor and agent name their parameter; the CLI the flag."""
    import oomguard
    from oomguard.commands.flags import flag_message
    from oomguard.supervisor.restart import RestartPolicy

    with pytest.raises(oomguard.BadParameter) as e:
        oomguard.Shape(0)
    assert (str(e.value), e.value.param) == ("per_job: must be above 0", "per_job")
    assert flag_message(e.value) == "--per-job: must be above 0"
    with pytest.raises(oomguard.BadParameter) as e:
        RestartPolicy(backoff_factor=0.5)
    assert flag_message(e.value) == "--backoff-factor: must be at least 1, got 0.5"
    with pytest.raises(oomguard.BadParameter) as e:
        RestartPolicy("sometimes")
    assert str(e.value).startswith("mode: ") and flag_message(e.value).startswith("--restart: expected one of")
    assert isinstance(e.value, oomguard.UsageError)  # exit 2, as every usage error
    proc = run_oomguard("plan", "--per-job", "0")
    assert (proc.returncode, proc.stderr) == (2, "oomguard: error: --per-job: must be above 0\n")
    proc = run_oomguard("run", "--backoff-factor", "0.5", "--", "true")
    assert (proc.returncode, proc.stderr) == (2, "oomguard: error: --backoff-factor: must be at least 1, got 0.5\n")
