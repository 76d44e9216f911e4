"""The container section: are we in a container, which runtime, and what showed it.

Signals, strongest first: ``KUBERNETES_SERVICE_HOST`` and ``kubepods`` in a cgroup
path (Kubernetes); ``/run/.containerenv`` and ``libpod`` (podman); ``/.dockerenv``
and ``docker`` (Docker); ``container=`` in the environment (set by podman, systemd-nspawn,
LXC); ``lxc``/lxcfs (LXC); ``microsoft``/``WSL`` in the kernel release (WSL, a VM, so
not a container). Provider hints: vast.ai sets ``VAST_CONTAINERLABEL`` and ``CONTAINER_ID``.

Runtimes that set no marker (plain runc and crun: no ``/.dockerenv``, no ``container=``) still
give themselves away by their namespaces: a PID or cgroup namespace other than the initial one.
The initial namespaces have fixed inode numbers (include/linux/proc_ns.h: ``PROC_PID_INIT_INO =
0xEFFFFFFCU``, ``PROC_CGROUP_INIT_INO = 0xEFFFFFFBU``), and ``/proc/self/ns/pid`` is a link whose
text is ``pid:[INODE]`` (namespaces(7)). systemd's ``detect_container()`` applies the same rule
(src/basic/virt.c ``running_in_pidns()`` -> ``VIRTUALIZATION_CONTAINER_OTHER``, the inode
compared by ``namespace_is_init()``), and names it ``container-other``: so does this probe, as
the runtime when no stronger signal names one. A process in a private namespace that is no
container (``unshare -p``, a sandboxing tool) is reported so too: the evidence says which.
"""

from __future__ import annotations

from oomguard.probes.mounts import CgroupEntry, Mount, mount_for
from oomguard.sources.root import Failure, Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import ContainerSection, Runtime

# Substrings of a cgroup path that only a container's group has (not docker.service).
_PATH_MARKERS: tuple[tuple[str, Runtime | None], ...] = (
    ("kubepods", "kubernetes"),
    ("libpod", "podman"),
    ("/docker/", "docker"),
    ("docker-", "docker"),
    ("/lxc/", "lxc"),
    ("lxc.payload", "lxc"),
    ("cri-containerd", None),
    ("crio-", None),
)
_ENV_RUNTIMES: dict[str, Runtime | None] = {
    "docker": "docker",
    "podman": "podman",
    "oci": None,
    "lxc": "lxc",
    "lxc-libvirt": "lxc",
    "systemd-nspawn": None,
    "kubernetes": "kubernetes",
}
_PRIORITY: tuple[Runtime, ...] = ("kubernetes", "podman", "docker", "lxc", "container-other")
PROVIDER_VARS = ("VAST_CONTAINERLABEL", "CONTAINER_ID")
# (link, name, the initial namespace's inode): include/linux/proc_ns.h.
INITIAL_NAMESPACES = (("/proc/self/ns/pid", "PID", 0xEFFFFFFC), ("/proc/self/ns/cgroup", "cgroup", 0xEFFFFFFB))


def parse_ns_link(text: str) -> int | None:
    """The inode of a namespace link's text, ``pid:[4026531836]`` -> 4026531836; None otherwise."""
    kind, sep, rest = text.strip().partition(":[")
    number = rest[:-1] if rest.endswith("]") else ""
    if not sep or not kind.isalpha() or not number.isdigit() or not number.isascii():
        return None
    return int(number)


def _namespaces(root: Root) -> list[str]:
    """One evidence line per namespace that is not the initial one."""
    found = []
    for link, name, initial in INITIAL_NAMESPACES:
        text = root.readlink(link)
        if isinstance(text, Failure):
            continue  # no such namespace (cgroup namespaces: Linux >= 4.6) or /proc hidden: no evidence
        inode = parse_ns_link(text)
        if inode is not None and inode != initial:
            found.append(f"namespace: {link} is {text.strip()[:40]}, not the initial {name} namespace ({initial})")
    return found


def probe_container(
    root: Root, env: dict[str, str], entries: list[CgroupEntry], mounts: list[Mount]
) -> ContainerSection:
    evidence: list[str] = []
    runtimes: set[Runtime] = set()
    container = False

    def saw(what: str, runtime: Runtime | None) -> None:
        nonlocal container
        container = True
        evidence.append(what)
        if runtime:
            runtimes.add(runtime)

    if env.get("KUBERNETES_SERVICE_HOST"):
        saw("environment: KUBERNETES_SERVICE_HOST is set", "kubernetes")
    if root.exists("/run/.containerenv"):
        saw("file: /run/.containerenv", "podman")
    if root.exists("/.dockerenv"):
        saw("file: /.dockerenv", "docker")
    if env.get("container"):
        saw(f"environment: container={env['container'][:40]}", _ENV_RUNTIMES.get(env["container"]))
    seen_paths: set[str] = set()
    for e in entries:  # a v1 path is listed once per hierarchy: say each path once
        if e.path in seen_paths:
            continue
        seen_paths.add(e.path)
        for marker, named in _PATH_MARKERS:
            if marker in e.path:
                saw(f"cgroup path: {e.path[:200]}", named)
                break
    m = mount_for(mounts, "/proc/meminfo")
    if m is not None and "lxcfs" in m.fstype:
        saw("mount: lxcfs over /proc/meminfo", "lxc")
    for line in _namespaces(root):
        saw(line, "container-other")
    rootfs = mount_for(mounts, "/")
    if rootfs is not None and rootfs.fstype == "overlay":
        evidence.append("mount: / is an overlay filesystem")  # weak: live systems use overlay too
    runtime: Runtime | None = next((r for r in _PRIORITY if r in runtimes), None)
    release = root.text("/proc/sys/kernel/osrelease") or ""
    if "microsoft" in release.lower() or "wsl" in release.lower():
        evidence.append(f"kernel release: {release.strip()[:80]}")
        runtime = runtime or "wsl"
    hints = {k: env[k][:200] for k in PROVIDER_VARS if k in env}
    provider = "vast.ai" if "VAST_CONTAINERLABEL" in env or any(k.startswith("VAST_") for k in env) else None
    return {
        "in_container": container,
        "runtime": runtime,
        "evidence": evidence,
        "provider": provider,
        "provider_hints": hints,
    }
