"""The container section: are we in a container, which runtime, and what showed it.

Signals, strongest first: ``KUBERNETES_SERVICE_HOST`` and ``kubepods`` in a cgroup
path (Kubernetes); ``/run/.containerenv`` and ``libpod`` (podman); ``/.dockerenv``
and ``docker`` (Docker); ``container=`` in the environment (set by podman, systemd-nspawn,
LXC); ``lxc``/lxcfs (LXC); ``microsoft``/``WSL`` in the kernel release (WSL, a VM, so
not a container). Provider hints: vast.ai sets ``VAST_CONTAINERLABEL`` and ``CONTAINER_ID``.
"""

from __future__ import annotations

from oomguard.probes.mounts import CgroupEntry, Mount, mount_for
from oomguard.sources.root import Failure, Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from oomguard._types import ContainerSection

# Substrings of a cgroup path that only a container's group has (not docker.service).
_PATH_MARKERS = (
    ("kubepods", "kubernetes"),
    ("libpod", "podman"),
    ("/docker/", "docker"),
    ("docker-", "docker"),
    ("/lxc/", "lxc"),
    ("lxc.payload", "lxc"),
    ("cri-containerd", None),
    ("crio-", None),
)
_ENV_RUNTIMES = {
    "docker": "docker",
    "podman": "podman",
    "oci": None,
    "lxc": "lxc",
    "lxc-libvirt": "lxc",
    "systemd-nspawn": None,
    "kubernetes": "kubernetes",
}
_PRIORITY = ("kubernetes", "podman", "docker", "lxc")
PROVIDER_VARS = ("VAST_CONTAINERLABEL", "CONTAINER_ID")


def probe_container(
    root: Root, env: dict[str, str], entries: list[CgroupEntry], mounts: list[Mount]
) -> ContainerSection:
    evidence: list[str] = []
    runtimes: set[str] = set()
    container = False

    def saw(what: str, runtime: str | None) -> None:
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
    for e in entries:
        for marker, runtime in _PATH_MARKERS:
            if marker in e.path:
                saw(f"cgroup path: {e.path[:200]}", runtime)
                break
    m = mount_for(mounts, "/proc/meminfo")
    if m is not None and "lxcfs" in m.fstype:
        saw("mount: lxcfs over /proc/meminfo", "lxc")
    rootfs = mount_for(mounts, "/")
    if rootfs is not None and rootfs.fstype == "overlay":
        evidence.append("mount: / is an overlay filesystem")  # weak: live systems use overlay too
    runtime = next((r for r in _PRIORITY if r in runtimes), None)
    release = root.read("/proc/sys/kernel/osrelease")
    if not isinstance(release, Failure) and ("microsoft" in release.lower() or "wsl" in release.lower()):
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
