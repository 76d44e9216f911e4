"""Job-shape profiles for ``oomguard plan``: built in (``profiles.json``) or from a user file.

A profile file is JSON (any Python) or TOML (Python >= 3.11), either ``{"profiles": {NAME: {...}}}``
or ``{NAME: {...}}``. Fields: ``per_job`` (required), ``baseline``, ``pinned_per_job``,
``pinned_baseline``, ``gpu_per_job`` (sizes: "14GiB" or bytes), ``pin_method`` (how the
pinned memory is pinned: ``cuda``, ``mlock`` or ``rdma``, see ``policy/plan.py``; default
``mlock``), ``max_jobs`` (int), ``cpus_per_job`` (number), ``consumer`` (whose own budget
arithmetic the plan also shows: ``cuzk``, see ``policy/cuzk.py``; optional), ``description``,
``source``, ``baseline_parts`` (text and a table of sizes as written; not used by the planner).

A user file is read as any file a flag names (``sources/files.py``): a regular file only (a FIFO or
``/dev/zero`` is refused at once, never waited on or read for ever), at most ``MAX_BYTES`` (1 MiB),
nested at most ``MAX_DEPTH`` (64) levels; anything else is a one-line ``--profiles`` error (exit 2).
"""

from __future__ import annotations

import json
import os
import sys

from oomguard.errors import BadParameter, UsageError
from oomguard.policy.plan import CONSUMERS, CPUS_MAX, CPUS_MIN
from oomguard.sources.files import MAX_DEPTH, loads_json, read_bounded, too_deep
from oomguard.units import MAX_SIZE, MAX_SIZE_TEXT, parse_size

MAX_BYTES = 1 << 20  # a profiles file holds a few hundred bytes per profile

SIZE_FIELDS = ("per_job", "baseline", "pinned_per_job", "pinned_baseline", "gpu_per_job")
# Where the built-in profiles live, for messages: read through the package's loader (pkgutil), not
# open(), so they are found inside a zip too (``make pyz``: dist/oomguard.pyz).
BUILTIN = os.path.join(os.path.dirname(__file__), "profiles.json")


def _read_builtin() -> object:
    import pkgutil

    data = pkgutil.get_data(__package__ or "oomguard", "profiles.json")
    if data is None:  # a loader that cannot read package data
        raise OSError(f"no loader can read the data of package {__package__!r}")
    return json.loads(data.decode("utf-8"))


def _toml(path: str) -> object:
    data: object = None
    if sys.version_info >= (3, 11):
        import tomllib  # novermin: guarded by the version check above

        text = read_bounded(path, MAX_BYTES).decode("utf-8")  # a UnicodeDecodeError is a ValueError
        try:
            data = tomllib.loads(text)
        except RecursionError:  # tomllib parses nested arrays and inline tables recursively
            data = None
    else:
        raise BadParameter("profiles", f"{path}: TOML needs Python >= 3.11; use a JSON file")
    if data is None or too_deep(data):
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
    return data


def _load(path: str, *, builtin: bool = False) -> dict[str, dict[str, object]]:
    try:
        if builtin:
            data = _read_builtin()
        elif path.endswith(".toml"):
            data = _toml(path)
        else:
            data = loads_json(read_bounded(path, MAX_BYTES))
    except OSError as exc:
        raise BadParameter("profiles", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeError:  # before ValueError: its message quotes the bytes
        raise BadParameter("profiles", f"{path} is not valid: not UTF-8 text") from None
    except ValueError as exc:  # json.JSONDecodeError and tomllib.TOMLDecodeError
        raise BadParameter("profiles", f"{path} is not valid: {str(exc).splitlines()[0]}") from None
    profiles = data.get("profiles", data) if isinstance(data, dict) else None
    if not isinstance(profiles, dict) or not all(isinstance(v, dict) for v in profiles.values()):
        raise BadParameter("profiles", f"{path}: expected a table of profiles, {{NAME: {{per_job: ...}}}}")
    return {k: v for k, v in profiles.items() if not k.startswith("_")}


def load_profiles(path: str | None = None) -> dict[str, dict[str, object]]:
    """Built-in profiles, overlaid with those of *path* (a user file wins on a name clash)."""
    profiles = _load(BUILTIN, builtin=True)
    if path is not None:
        profiles.update(_load(path))
    return profiles


def check_cpus(value: float, what: str) -> float:
    """*value* when it is from ``CPUS_MIN`` to ``CPUS_MAX``; ``UsageError`` naming *what* otherwise."""
    if not CPUS_MIN <= value <= CPUS_MAX:  # NaN fails too
        raise UsageError(f"{what}: must be from {CPUS_MIN:g} to {CPUS_MAX:g}, got {value!r}")
    return value


def profile_values(name: str, profile: dict[str, object]) -> dict[str, object]:
    """A profile's fields as Shape arguments: sizes in bytes, counts as numbers."""
    out: dict[str, object] = {}
    for key, value in profile.items():
        what = f"profile {name!r}: {key}"
        if key in SIZE_FIELDS:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise UsageError(f"{what}: expected a size such as '14GiB', got {value!r}")
            out[key] = value if isinstance(value, int) else parse_size(value, what)
            if isinstance(value, int) and value < 0:
                raise UsageError(f"{what}: must not be negative")
            if isinstance(value, int) and value > MAX_SIZE:
                raise UsageError(f"{what}: {value} is too large (at most {MAX_SIZE_TEXT})")
        elif key == "pin_method":
            from oomguard.policy.plan import PIN_METHODS

            if value not in PIN_METHODS:
                raise UsageError(f"{what}: expected one of {', '.join(PIN_METHODS)}, got {value!r}")
            out[key] = value
        elif key == "consumer":
            if value not in CONSUMERS:
                raise UsageError(f"{what}: expected one of {', '.join(CONSUMERS)}, got {value!r}")
            out[key] = value
        elif key == "max_jobs":
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{what}: expected a whole number, got {value!r}")
            out[key] = value
        elif key == "cpus_per_job":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"{what}: expected a number, got {value!r}")
            out[key] = check_cpus(float(value), what)
    if "per_job" not in out:
        raise UsageError(f"profile {name!r}: per_job is required")
    return out
