"""Every flag's value, in range or a one-line error (exit 2); every file a flag names, read safely.

Three layers:
- the parsers (``units.parse_size``, ``parse_duration``): any text is a value at most ``MAX_SIZE`` /
  ``MAX_DURATION`` or a one-line ``UsageError``, and the maxima themselves are taken;
- the file inputs: ``--profiles`` as a FIFO, ``/dev/zero``, a link to it, a file over the cap, JSON
  and TOML nested 100,000 deep: one line, exit 2, at once;
- the commands themselves: hypothesis draws flags of every command from its argparse parser (of
  ``manager`` only ``manager token NODE``: the server serves for ever) with hostile values by
  metavar, and runs the real command under a time-out: no traceback, no hang, only documented exit
  codes, an error in one line.

Valid sizes are kept small here on purpose (root may really ``mlock`` a ``--probe-mlock`` size) and
``--hold`` short: the subprocess test is about the values that must be refused.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomguard.cli import COMMANDS, build_parser
from oomguard.errors import EXIT_CODES, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from oomguard.units import MAX_DURATION, MAX_SIZE, parse_duration, parse_size
from tests.conftest import FIXTURES, REPO
from tests.helpers.fuzz import examples
from tests.helpers.hostile import zero_tarball

TIMEOUT_S = 60  # per invocation: a hang fails the test instead of stalling it
# Exit codes a command may end with here (70: internal errors, 130: interrupted, are bugs here).
ALLOWED = {code for code, _ in EXIT_CODES} - {EXIT_INTERNAL, EXIT_INTERRUPTED}
# A TOML profiles file is read by tomllib (3.11+); on 3.10 the same file is a one-line refusal too.
TOML_DEEP = "nested more than 64 levels deep" if sys.version_info >= (3, 11) else "TOML needs Python >= 3.11"
SKIPPED_FLAGS = {"--help", "--isolate"}  # --isolate creates memory cgroups: no value to parse
FIXTURE = str(FIXTURES / "docker_v2_swap_max" / "root")

# --- the parsers ------------------------------------------------------------------------------


@given(st.text(max_size=40))
def test_parse_size_gives_a_size_in_range_or_one_line(text: str) -> None:
    try:
        value = parse_size(text, "--x")
    except UsageError as exc:
        assert str(exc).startswith("--x: ") and "\n" not in str(exc).strip("\n")
    else:
        assert 0 <= value <= MAX_SIZE


@given(st.text(max_size=40))
def test_parse_duration_gives_a_duration_in_range_or_one_line(text: str) -> None:
    try:
        value = parse_duration(text, "--x")
    except UsageError as exc:
        assert str(exc).startswith("--x: ")
    else:
        assert 0 <= value <= MAX_DURATION


@given(st.integers(0, 2**80), st.sampled_from(["", "B", "K", "MiB", "G", "TB", "PiB"]))
def test_sizes_up_to_the_maximum_and_no_further(n: int, unit: str) -> None:
    text = f"{n}{unit}"
    try:
        value = parse_size(text, "--x")
    except UsageError as exc:
        assert "too large" in str(exc) or len(str(n)) > 30
    else:
        assert value <= MAX_SIZE


def test_the_maxima_are_taken_and_one_more_is_not() -> None:
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE
    assert parse_duration("3650d") == MAX_DURATION
    with pytest.raises(UsageError, match=r"^--budget: '9223372036854775808' is too large \(at most 2\^63-1 bytes\)$"):
        parse_size(str(MAX_SIZE + 1), "--budget")
    with pytest.raises(UsageError, match=r"^--hold: '3650.001d' is too long \(at most 3650d\)$"):
        parse_duration("3650.001d", "--hold")


# --- hostile files and values, each a case the issue names -------------------------------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Paths to hostile inputs, by name."""
    base = tmp_path_factory.mktemp("hostile")
    os.mkfifo(base / "fifo")
    os.symlink("/dev/zero", base / "zero-link")
    (base / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (base / "deep.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    (base / "big.json").write_text(" " * (1 << 20) + "{}")  # one byte over the 1 MiB cap
    (base / "profiles.json").write_text('{"tiny": {"per_job": "4KiB"}}')
    (base / "bad-utf8.json").write_bytes(b'{"\xff": {}}')
    (base / "adir").mkdir()
    (base / "events.jsonl").write_text("")
    zero_tarball(str(base / "zeros.tar.gz"), 40)
    names = ("fifo", "zero-link", "deep.json", "deep.toml", "big.json", "profiles.json", "bad-utf8.json", "adir")
    paths = {name: str(base / name) for name in names}
    paths |= {"zeros": str(base / "zeros.tar.gz"), "events": str(base / "events.jsonl"), "base": str(base)}
    return paths


def _run(argv: list[str], home: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OOMGUARD_") and "proxy" not in k.lower()}
    env |= {"PYTHONPATH": str(REPO / "src"), "HOME": home, "OOMGUARD_SPOOL": os.path.join(home, "spool")}
    env.pop("XDG_STATE_HOME", None)
    cmd = [sys.executable, "-m", "oomguard", *argv]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {TIMEOUT_S} s: oomguard {' '.join(argv)}")


def _clean(proc: subprocess.CompletedProcess[str], argv: list[str]) -> None:
    """No traceback, a documented exit code, and an error said in one line."""
    said = f"oomguard {argv!r} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, said
    assert proc.returncode in ALLOWED, said
    if proc.returncode == EXIT_USAGE:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("oomguard: error: ")]
        assert len(errors) == 1, said


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["verify", "--hold", "99999999999999999999"], "--hold: '99999999999999999999' is too long"),
        (["agent", "--manager", "http://127.0.0.1:9", "--interval", "99999999999d"], "--interval: "),
        (["run", "--backoff-max", "30000d", "--", "true"], "--backoff-max: '30000d' is too long"),
        (["check", "--budget", "99999999999999999999P"], "--budget: '99999999999999999999P' is too large"),
        (["plan", "--per-job", "9223372036854775808"], "--per-job: '9223372036854775808' is too large"),
        (["plan", "--per-job", "1G", "--cpus-per-job", "1e-320"], "--cpus-per-job: must be from 0.001"),
        (["plan", "--profile", "tiny", "--profiles", "{fifo}"], "not a regular file"),
        (["plan", "--profile", "tiny", "--profiles", "/dev/zero"], "not a regular file"),
        (["plan", "--profile", "tiny", "--profiles", "{zero-link}"], "not a regular file"),
        (["plan", "--profile", "tiny", "--profiles", "{adir}"], "not a regular file"),
        (["plan", "--profile", "tiny", "--profiles", "{big.json}"], "larger than 1 MiB"),
        (["plan", "--profile", "tiny", "--profiles", "{deep.json}"], "nested more than 64 levels deep"),
        (["plan", "--profile", "tiny", "--profiles", "{deep.toml}"], TOML_DEEP),
        (["plan", "--profile", "tiny", "--profiles", "{bad-utf8.json}"], "not UTF-8 text"),
        (["check", "--root", "{zeros}"], "is too large: its files hold more than 32 MiB"),
        (["check", "--root", "{fifo}"], "is neither a snapshot directory nor a regular file"),
        (["run", "--events", "{fifo}", "--budget", "1MiB", "--", "true"], "a FIFO that no process reads"),
        (["capture", "--force", "{fifo}"], "exists and is not a regular file"),
    ],
)
def test_each_named_case_is_one_line_and_exit_2(hostile: dict[str, str], argv: list[str], words: str) -> None:
    argv = [hostile[a[1:-1]] if a.startswith("{") else a for a in argv]
    proc = _run(argv, hostile["base"])
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.startswith("oomguard: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert words in proc.stderr, proc.stderr


def test_good_profiles_still_load(hostile: dict[str, str]) -> None:
    proc = _run(
        ["plan", "--profile", "tiny", "--profiles", hostile["profiles.json"], "--budget", "1MiB"], hostile["base"]
    )
    assert proc.returncode == 0 and "256" in proc.stdout, proc.stderr


# --- every command's flags, drawn from its parser ---------------------------------------------

DIGITLESS = st.text(st.characters(blacklist_categories=["Cs", "Nd"], blacklist_characters="\x00"), max_size=12)
ANY_TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=24)
HUGE = st.integers(MAX_SIZE + 1, 2**100).map(str)
SIZES = st.one_of(
    st.sampled_from(["0", "1", "4KiB", "1.5K", "64KiB", "65536", "0.5M", "-1", "-1G", "1e9", "nan", "inf", ""]),
    st.sampled_from(["9" * 30, "9" * 31, "99999999999999999999P", str(MAX_SIZE + 1), "8EiB", "80%", "101%", "nan%"]),
    st.sampled_from(["-0%", "1__0", "0x10", "\u0661\u0662", "\uff11G", " 1K ", "1 GiBs", "1.2.3G"]),
    st.integers(0, 65536).map(str),
    HUGE,
    st.builds(lambda n, u: f"{n}{u}", st.integers(10**7, 10**12), st.sampled_from(["T", "P", "TB", "PiB"])),
    DIGITLESS,
)
SHORT = st.sampled_from(["0", "0.1", "1", "500ms", "1.5s", "2s", "0s"])
TOO_LONG = st.one_of(
    st.sampled_from(["3650.1d", "99999999999d", "9" * 20, "9" * 31, "1e5", "inf", "nan", "-1", "-1s", "1y", ""]),
    st.sampled_from(["\u0661", "0x1", "1e309", "5m5s", ".", "..5", "1 hour", "h"]),
    st.integers(int(MAX_DURATION) + 1, 10**30).map(str),
    DIGITLESS,
)
LONG_OK = st.sampled_from(["1h", "3650d", "10m", "1d"])
NUMBERS = st.one_of(
    st.sampled_from(["0", "1", "2", "-1", "1.5", "1e-320", "1e308", "1e309", "inf", "nan", "-0", "0x10", "9" * 5000]),
    st.sampled_from(["1_000", " 3 ", "", "255", "256", "0.0001", "0.5"]),
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    DIGITLESS,
)
URLS = st.sampled_from(
    [
        *("http://127.0.0.1:9", "http://127.0.0.1:9/p/", "https://127.0.0.1:9", "ftp://127.0.0.1", "http://", ""),
        *("x" * 300, "http://[::1", "http://u:p@127.0.0.1:9", "http://127.0.0.1:99999", "http://127.0.0.1:9/\n"),
        "127.0.0.1:9",
    ]
)


def _files(hostile: dict[str, str]) -> st.SearchStrategy[str]:
    return st.sampled_from(
        [*(v for k, v in hostile.items() if k != "base"), FIXTURE, "/dev/zero", "/dev/null", "/nonexistent/x", ""]
    )


def _dirs(hostile: dict[str, str]) -> st.SearchStrategy[str]:
    base = hostile["base"]
    return st.sampled_from(
        [os.path.join(base, "spool2"), hostile["fifo"], hostile["adir"], hostile["events"], "/dev/null", "", "/proc/x"]
    )


def _value(command: str, flag: str, metavar: str, hostile: dict[str, str]) -> st.SearchStrategy[str]:
    """Hostile values for one option, chosen by its metavar (and by the flag where it matters)."""
    if metavar in ("SIZE", "SPEC"):
        return SIZES
    if metavar in ("DURATION", "SECONDS"):
        long_ok = flag != "--hold"  # a long hold holds for real
        return st.one_of(SHORT, TOO_LONG, *([LONG_OK] if long_ok else []))
    if metavar in ("N", "X", "F"):
        return NUMBERS
    if metavar in ("FILE", "PATH"):
        return _files(hostile)
    if metavar == "DIR":
        return _dirs(hostile)
    if metavar == "URL":
        return URLS
    choices = {
        "SIGNAL": ["SIGUSR1", "USR1", "10", "none", "0", "99", "-1"],
        "KEY=VALUE": ["a=b", "=", "a=", "k" * 99 + "=v"],
    }
    words = ["check", "plan", "verify", "cuda", "mlock", "on-failure", "never", "margin", "concurrency", "tiny"]
    return st.one_of(ANY_TEXT, st.sampled_from(choices.get(metavar, []) + words))


def _options(command: str) -> list[tuple[str, str | None]]:
    """(flag, metavar or None for a switch) of every option of *command*, from argparse's parser."""
    parser = build_parser(full=True)
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = []
    for action in subparsers.choices[command]._actions:
        if not action.option_strings or SKIPPED_FLAGS & set(action.option_strings):
            continue
        takes = action.nargs != 0
        found.append((action.option_strings[0], str(action.metavar) if takes else None))
    return found


# Around the drawn flags: what keeps each command quick and harmless (later flags win in argparse).
BEFORE = {"plan": ["--per-job", "4KiB"], "verify": ["--per-job", "64KiB"], "agent": ["--manager", "http://127.0.0.1:9"]}
AFTER = {
    "verify": ["--budget", "1MiB", "--max-jobs", "2", "--hold", "0"],  # not 3 s of holding per example
    "agent": ["--once"],
    "run": ["--budget", "1MiB", "--restart", "never", "--", "true"],
}
FUZZED = [c for c in COMMANDS if c not in ("manager", "capture", "completion")]
_counter = itertools.count()


@st.composite
def _argv(draw: st.DrawFn, command: str, hostile: dict[str, str]) -> list[str]:
    argv = [command, *BEFORE.get(command, [])]
    for flag, metavar in draw(st.lists(st.sampled_from(_options(command)), min_size=1, max_size=4)):
        argv += [flag] if metavar is None else [flag, draw(_value(command, flag, metavar, hostile))]
    return argv + AFTER.get(command, [])


def _fuzz_settings() -> settings:
    return settings(
        max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )


@pytest.mark.parametrize("command", FUZZED)
@pytest.mark.slow
def test_no_traceback_and_no_hang_from_any_flags(command: str, hostile: dict[str, str], tmp_path: Path) -> None:
    assert _options(command)  # the parser was read

    @_fuzz_settings()
    @given(_argv(command, hostile))
    def one(argv: list[str]) -> None:
        _clean(_run(argv, str(tmp_path)), argv)

    one()


def test_capture_and_completion_take_any_argument(hostile: dict[str, str], tmp_path: Path) -> None:
    places = st.sampled_from(["new", "fifo", "adir", "nested/missing/x.tar.gz", "same.tar.gz", "link"])
    os.symlink(hostile["events"], tmp_path / "link")

    def path_of(place: str) -> str:
        if place == "new":
            return str(tmp_path / f"snap-{next(_counter)}.tar.gz")
        return hostile[place] if place in hostile else str(tmp_path / place)

    capture = st.builds(
        lambda force, place: ["capture", *force, path_of(place)], st.sampled_from([[], ["--force"]]), places
    )
    completion = st.builds(
        lambda shell: ["completion", shell], st.one_of(st.sampled_from(["bash", "zsh", "fish", ""]), ANY_TEXT)
    )

    @_fuzz_settings()
    @given(st.one_of(capture, completion))
    def one(argv: list[str]) -> None:
        _clean(_run(argv, str(tmp_path)), argv)

    one()
    assert os.path.exists(hostile["fifo"]) and not os.path.isfile(hostile["fifo"])  # never replaced
    assert os.path.islink(tmp_path / "link")


def test_manager_token_takes_any_node_and_secret(tmp_path: Path) -> None:
    """``manager token NODE`` prints and exits (the one ``manager`` form that does not serve)."""
    secrets = st.one_of(st.sampled_from(["0123456789abcdef0123", "", "a,b", " s "]), ANY_TEXT)
    argv = st.builds(lambda node, secret: ["manager", "token", node, "--fleet-secret", secret], ANY_TEXT, secrets)

    @_fuzz_settings()
    @given(argv)
    def one(args: list[str]) -> None:
        _clean(_run(args, str(tmp_path)), args)

    one()
