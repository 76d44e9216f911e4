"""Job-shape profiles for ``oomguard plan``: built in (``profiles.json``) or from a user file.

A profile file is JSON (any Python) or TOML (Python >= 3.11), either ``{"profiles": {NAME: {...}}}``
or ``{NAME: {...}}``. Fields: ``per_job`` (required), ``baseline``, ``pinned_per_job``,
``pinned_baseline``, ``gpu_per_job`` (sizes: "14GiB" or bytes), ``pin_method`` (how the
pinned memory is pinned: ``cuda``, ``mlock`` or ``rdma``, see ``policy/plan.py``; default
``mlock``), ``max_jobs`` (int), ``cpus_per_job`` (number), ``description``, ``source`` (text;
not used by the planner).
"""

from __future__ import annotations

import json
import os
import sys

from oomguard.errors import BadParameter, UsageError
from oomguard.units import parse_size

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


def _load(path: str, *, builtin: bool = False) -> dict[str, dict[str, object]]:
    try:
        if builtin:
            data = _read_builtin()
        elif path.endswith(".toml"):
            if sys.version_info >= (3, 11):
                import tomllib  # novermin: guarded by the version check above

                with open(path, "rb") as f:
                    data = tomllib.load(f)
            else:
                raise BadParameter("profiles", f"{path}: TOML needs Python >= 3.11; use a JSON file")
        else:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
    except OSError as exc:
        raise BadParameter("profiles", f"cannot read {path}: {exc.strerror or exc}") from None
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
        elif key == "pin_method":
            from oomguard.policy.plan import PIN_METHODS

            if value not in PIN_METHODS:
                raise UsageError(f"{what}: expected one of {', '.join(PIN_METHODS)}, got {value!r}")
            out[key] = value
        elif key == "max_jobs":
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{what}: expected a whole number, got {value!r}")
            out[key] = value
        elif key == "cpus_per_job":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"{what}: expected a number, got {value!r}")
            out[key] = float(value)
    if "per_job" not in out:
        raise UsageError(f"profile {name!r}: per_job is required")
    return out
