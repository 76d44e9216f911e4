"""Print a report: one JSON object (``--json``) or an aligned text summary."""

from __future__ import annotations

from oomguard.units import format_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import CgroupSection, Report


def _finite(data: object) -> object:
    """*data* with NaN and infinities as None: JSON has no literal for them."""
    if isinstance(data, float) and data - data != 0.0:
        return None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def to_json(data: object) -> str:
    """``json.dumps(data, indent=2)``; a non-finite float (never in a report) becomes null."""
    import json  # here: the human report does not need it

    try:
        return json.dumps(data, indent=2, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(data), indent=2, allow_nan=False)


def _row(label: str, value: str, note: str = "") -> str:
    return f"  {label:<16} {value:<14} {note}".rstrip()


def _swap(report: Report) -> str:
    swap = report["memory"]["swap"]
    if not swap["known"]:
        return "not accounted"
    text = "unlimited" if swap["limit_bytes"] is None else format_size(swap["limit_bytes"])
    return text + (" (the host has no swap)" if swap["host_total_bytes"] == 0 else "")


def format_human(report: Report) -> str:
    mem, cg, b = report["memory"], report["memory"]["cgroup"], report["budget"]
    lines = [f"oomguard check ({'live system' if report['root'] == '/' else 'snapshot ' + report['root']})", "Memory"]
    why = {"meminfo": "MemTotal binds: no lower cgroup limit"}.get(mem["limited_by"] or "", "")
    if mem["limited_by"] and mem["limited_by"].startswith("cgroup"):
        why = f"{mem['limited_by']} limit binds"
    lines.append(_row("effective limit", format_size(mem["effective_bytes"]), why))
    lines.append(_row("", "", f"from {mem['limit_file']}") if mem["limit_file"] else "")
    if cg["ancestors_visible"] is False:  # said next to the limit, and as warning limit-may-be-hidden
        lines.append(_row("", "", "may be lower: a limit above the cgroup namespace root cannot be seen"))
    lines.append(
        _row(
            "host RAM",
            format_size(mem["host_total_bytes"]),
            "MemTotal (lxcfs: the container's limit)" if mem["meminfo_virtualized"] else "MemTotal",
        )
    )
    lines.extend(_soft_rows(report))
    lines.append(_row("swap limit", _swap(report)))
    ws = mem["working_set_bytes"]
    lines.append(
        _row("usage", format_size(mem["usage_bytes"]), f"working set {format_size(ws)}" if ws is not None else "")
    )
    lines.append(_row("available", format_size(mem["available_bytes"])))
    if mem["pressure"]:
        some = mem["pressure"].get("some") or {}
        if isinstance(some, dict):
            lines.append(_row("pressure", f"{some.get('avg10', 0):.2f}%", f"some avg10 ({mem['pressure']['source']})"))
    if mem["oom"]:
        lines.append(
            _row(
                "OOM kills",
                str(mem["oom"]["oom_kill"] if mem["oom"]["oom_kill"] is not None else "-"),
                mem["oom"]["source"],
            )
        )
    version = cg["version"]
    lines.append(_row("cgroup", f"v{version}" if version else "none", _cgroup_where(cg) if version else ""))
    lines.append("Budget")
    if b["source"] == "auto":
        note = f"auto: {format_size(b['basis_bytes'])} basis - {format_size(b['safety_margin_bytes'])} margin"
    else:
        note = f"{b['source']}: {b['requested']}"
    lines.append(_row("budget", format_size(b["bytes"]), note))
    ml = report["memlock"]
    lines.append("Memlock")
    soft = "unlimited" if ml["known"] and ml["soft_bytes"] is None else format_size(ml["soft_bytes"])
    hard = "unlimited" if ml["known"] and ml["hard_bytes"] is None else format_size(ml["hard_bytes"])
    cap = {True: "yes", False: "no", None: "unknown"}[ml["cap_ipc_lock"]]
    lines.append(_row("soft / hard", f"{soft} / {hard}" if ml["known"] else "unknown", f"CAP_IPC_LOCK {cap}"))
    for label, result in (("mlock probe", ml.get("probe")), ("pinned probe", ml.get("pinned_probe"))):
        if result:
            lines.append(_row(label, *_pin_result(result)))
    cpu, ct = report["cpu"], report["container"]
    lines.append("CPU")
    eff = cpu["effective_cpus"]
    lines.append(
        _row("effective CPUs", "-" if eff is None else f"{eff:g}", f"limited by {cpu['limited_by']}" if eff else "")
    )
    gd, gpus = report["gpu_driver"], report["gpus"]
    lines.append("GPUs")
    if gd["status"] == "ok":
        lines.append(_row("visible", str(len(gpus)), f"via {gd['source']}, driver {gd['driver_version'] or '?'}"))
        nv = gd["visibility"]["nvidia_visible_devices"]
        if nv:
            lines.append(_row("container GPUs", nv, "NVIDIA_VISIBLE_DEVICES, applied by the runtime"))
        lines.extend(
            _row(
                f"  {g['index']}",
                format_size(g["memory_total_bytes"]),
                f"{g['name']}, {format_size(g['memory_free_bytes'])} free",
            )
            for g in gpus
        )
    else:
        gpu_why = {"no-driver": "no NVIDIA driver", "skipped": "--no-gpu", "failed": "the probe failed: see warnings"}
        lines.append(_row("visible", "none" if gd["status"] != "failed" else "unknown", gpu_why.get(gd["status"], "")))
    lines.append("Container")
    lines.append(_row("in container", "yes" if ct["in_container"] else "no", ct["runtime"] or ""))
    if ct["provider"]:
        lines.append(_row("provider", ct["provider"], " ".join(f"{k}={v}" for k, v in ct["provider_hints"].items())))
    lines.append(f"Warnings ({len(report['warnings'])})")
    lines.extend(f"  {w['code']}: {w['message']}" for w in report["warnings"])
    return "\n".join(line for line in lines if line) + "\n"


def _soft_rows(report: Report) -> list[str]:
    """The soft limit and the protections, each as what it is.

    v2 ``memory.high`` is a throttle line (the budget's basis when lower than the limit). v1's
    ``memory.soft_limit_in_bytes`` is a reclaim target: "control groups are pushed back to their soft
    limits" under contention, and may use more (cgroup-v1/memory.rst §7, "Soft limits"). v2's
    ``memory.min`` and ``memory.low`` are protections: what reclaim leaves the group (cgroup-v2.rst
    3-3, "Protections"). None of the last three is a cap.
    """
    mem = report["memory"]
    soft, prot = mem["soft_limit_bytes"], mem["protection"]
    if mem["cgroup"]["version"] == 1:
        v1 = prot["v1_soft_limit_bytes"]
        note = "memory.soft_limit_in_bytes: a reclaim target under contention, not a cap" if v1 is not None else ""
        return [_row("soft limit", format_size(v1) if v1 is not None else "none", note)]
    rows = [_row("soft limit", format_size(soft), "memory.high" if soft else "")]
    for value, name, how in ((prot["min_bytes"], "memory.min", ""), (prot["low_bytes"], "memory.low", " where it can")):
        if value:
            rows.append(_row("protection", format_size(value), f"{name}: kept from reclaim{how}, not a cap"))
    return rows


def _pin_result(result: dict[str, object]) -> tuple[str, str]:
    """(size, outcome) of a --probe-mlock / --probe-pinned result for the text report."""
    size = result.get("bytes")
    shown = format_size(size) if isinstance(size, int) else "-"
    if result.get("ok"):
        return shown, "locked and released"
    if result.get("skipped"):
        return shown, f"skipped: {result['skipped']}"
    return shown, f"FAILED: {result.get('error') or 'unknown error'}"


def _cgroup_where(cg: CgroupSection) -> str:
    """Where the group is: its path and directory, or why the directory is not known."""
    if cg["dir"] is None:
        return f"{cg['path']}: directory not found (cgroup-not-found)"
    return f"{cg['path']} at {cg['dir']}"
