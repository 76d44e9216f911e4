"""Real OCI runtimes (runc, crun, podman) for tests: containers without network or image.

Shared by the host suite (tests/integration/test_runtimes.py, cgroup v1 on this machine kind) and the VM's
guest checks (tests/integration/vm/guest/check_runtimes.py, cgroup v2). Imports nothing of oomguard: the
kernel's numbers are read from outside the container with plain file reads, so the probe is
never graded by its own logic.

- The rootfs is a directory of empty mount points plus read-only binds of the host's ``/usr``,
  ``/etc``, the Python installation and the checkout, a tmpfs on ``/tmp`` and a writable
  ``/out`` (events files). No ``/.dockerenv`` (this machine kind's root has one) and no
  ``container=``: a plain runc/crun container carries no marker, as in production.
- Every container's group lies under one session group made under the test process's own
  memory cgroup, named by an absolute ``cgroupsPath`` (crun reads a relative one from the
  hierarchy root, runc from its own group). On v1 the runtimes create that path in every
  hierarchy; ``Lab.close`` removes what they left, and every container, even after a failure.
- Traps of this machine kind (docs: /work/shared/edge-cases.md, "Real container runtimes"):
  crun refuses a hybrid host whose ``/sys/fs/cgroup/unified`` has controllers, so it runs in a
  private mount namespace with that mount unmounted; podman as root needs
  ``--cgroup-manager=cgroupfs --runtime=runc --storage-driver vfs``, its state in a temp dir and
  ``--ulimit nofile/nproc`` below the hard limits; conmon's group stays busy for a moment.
- The command under test is the container's own (``init_argv``), never an ``exec``: in the VM a
  process joining the container's mount namespace lands in the initramfs, not the rootfs. Each
  container runs one ``oomguard check`` (or a few ``oomguard run`` in a row) and then waits, so
  its group can be read from outside before it is deleted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.paths import REPO
from tests.helpers.wait import wait_until

MiB = 1 << 20
# The initial namespaces' inodes are fixed (include/linux/proc_ns.h: PROC_PID_INIT_INO 0xEFFFFFFC,
# PROC_CGROUP_INIT_INO 0xEFFFFFFB); systemd's running_in_pidns() compares against the first.
INITIAL_PID_NS = 0xEFFFFFFC
INITIAL_CGROUP_NS = 0xEFFFFFFB
RUNTIMES = ("runc", "crun", "podman")
# Docker's default capability set (moby oci/caps/defaults.go), so that a container is no more
# privileged than a user's.
CAPS = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
    "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
    "CAP_AUDIT_WRITE",
]  # fmt: skip
TIMEOUT_S = 120
RUNC_DEFAULT_ROOT = Path("/run/runc")


def python_exe() -> str:
    """The real interpreter (a venv's python is a symlink to it): the container has no venv."""
    return os.path.realpath(sys.executable)


def container_env() -> list[str]:
    return [
        "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        f"PYTHONPATH={REPO / 'src'}",
        "PYTHONDONTWRITEBYTECODE=1",
        "HOME=/tmp",
        "LANG=C.UTF-8",
    ]


def _binds() -> list[str]:
    """Host directories bound read-only at the same path: the userland, Python, the checkout."""
    prefix = os.path.realpath(sys.base_prefix)
    out = ["/usr", "/etc"]
    # /bin, /lib, /lib64, /sbin: links into /usr on a merged-/usr system (make_rootfs), else bound
    out += [b for b in ("/bin", "/lib", "/lib64", "/sbin") if Path(b).is_dir() and not Path(b).is_symlink()]
    if not any(prefix == b or prefix.startswith(b + "/") for b in out):
        out.append(prefix)
    out.append(str(REPO))
    return out


def make_rootfs(where: Path) -> Path:
    """Empty mount points, and /bin, /lib, /lib64, /sbin as the host has them: links into /usr
    (merged /usr, Debian 12) or directories to bind."""
    where.mkdir(parents=True)
    for name in ("bin", "lib", "lib64", "sbin"):
        host = Path("/" + name)
        if host.is_symlink():
            (where / name).symlink_to(os.readlink(host))
    for d in ("proc", "sys", "dev", "tmp", "out", "run", "etc", "usr", *[b.lstrip("/") for b in _binds()]):
        (where / d).mkdir(parents=True, exist_ok=True)
    return where


def _mounts(out: Path) -> list[dict[str, Any]]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        },
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
        {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755"]},
        *[{"destination": b, "type": "bind", "source": b, "options": ["rbind", "ro"]} for b in _binds()],
        {"destination": "/out", "type": "bind", "source": str(out), "options": ["rbind", "rw"]},
    ]


@dataclass(frozen=True)
class Limits:
    """``linux.resources.memory`` of the OCI spec (runtime-spec config-linux.md, "Memory")."""

    limit: int | None = None
    swap: int | None = None  # memory + swap (v1 memsw); runtimes write swap - limit to memory.swap.max on v2
    reservation: int | None = None  # v1 memory.soft_limit_in_bytes, v2 memory.low

    def oci(self) -> dict[str, int]:
        fields = {"limit": self.limit, "swap": self.swap, "reservation": self.reservation}
        return {k: v for k, v in fields.items() if v is not None}

    def podman(self) -> list[str]:
        out = []
        if self.limit is not None:
            out.append(f"--memory={self.limit}b")
        if self.swap is not None:
            out.append(f"--memory-swap={self.swap}b")
        if self.reservation is not None:
            out.append(f"--memory-reservation={self.reservation}b")
        return out


def bundle_config(rootfs: Path, out: Path, cgroups_path: str, limits: Limits, cgroupns: bool) -> dict[str, Any]:
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]
    if cgroupns:
        namespaces.append({"type": "cgroup"})
    caps = {k: CAPS for k in ("bounding", "effective", "permitted")}
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["true"],  # set by Lab.start
            "env": container_env(),
            "cwd": "/",
            "capabilities": caps,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "oomguard-test",
        "mounts": _mounts(out),
        "linux": {"cgroupsPath": cgroups_path, "namespaces": namespaces, "resources": {"memory": limits.oci()}},
    }


# -- where the groups go --------------------------------------------------------------------


@dataclass(frozen=True)
class Hierarchy:
    """The memory hierarchy as a runtime names it: *mount* + a cgroup path from its root."""

    version: int
    mount: Path
    own: str  # this process's group, as /proc/self/cgroup shows it (the runtimes' cgroupsPath form)

    def dir(self, cgroup_path: str) -> Path:
        return self.mount / cgroup_path.lstrip("/")


def hierarchy(version: int, own_dir: Path) -> Hierarchy | str:
    """From ``tests.helpers.realcgroup.writable_parent()``'s answer: the mount and this group's path, or why not.

    The runtimes' absolute ``cgroupsPath`` counts from the hierarchy's root, so that root must be
    what is mounted (it is, on a host; not in a container that bound its own group).
    """
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if (version == 1 and hid != "0" and "memory" in controllers.split(",")) or (version == 2 and hid == "0"):
            rel = path.rstrip("/")
            if rel and not str(own_dir).endswith(rel):
                return f"{own_dir} is not mount point + {path}: the hierarchy's root is not mounted here"
            return Hierarchy(version, Path(str(own_dir)[: len(str(own_dir)) - len(rel)] or "/"), path)
    return "no memory line in /proc/self/cgroup"


def open_lab(workdir: Path) -> Lab | str:
    """A ``Lab`` under this process's own memory cgroup (``tests.helpers.realcgroup``), or why there can be none."""
    from tests.helpers.realcgroup import writable_parent

    version, parent = writable_parent()
    if version is None:
        return f"real cgroups unavailable: {parent}"
    hier = hierarchy(version, Path(parent))
    if isinstance(hier, str):
        return f"container runtimes cannot place groups here: {hier}"
    return Lab(hier, workdir)


def lab_or_skip(workdir: Path) -> Iterator[Lab]:
    """A module fixture's body: the ``Lab`` (pytest.skip, with the reason, where there can be none),
    closed afterwards whatever happened."""
    import pytest

    lab = open_lab(workdir)
    if isinstance(lab, str):
        pytest.skip(lab)
    try:
        yield lab
    finally:
        lab.close()


def usable_or_skip(lab: Lab, runtime: str) -> str:
    """*runtime*, or pytest.skip with the reason it cannot start a container here."""
    why = lab.usable(runtime)
    if why is not None:
        import pytest

        pytest.skip(f"{runtime} cannot start a container here: {why}")
    return runtime


def hybrid_unified() -> bool:
    """A cgroup2 mount beside v1 with controllers in it: crun refuses such a host."""
    f = Path("/sys/fs/cgroup/unified/cgroup.controllers")
    return f.exists() and bool(f.read_text().split())


def other_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy but memory's (v1, and a hybrid host's cgroup2), for cleaning up."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fstype, _, opts = post.split(" ", 2)
        point = pre.split(" ")[4]
        if (fstype == "cgroup" and "memory" not in opts.split(",")) or (
            fstype == "cgroup2" and point != "/sys/fs/cgroup"
        ):
            out.append(Path(point))
    return out


def _kill_and_rmdir(d: Path, version: int, tries: int = 100) -> None:
    """Remove *d* and its children, killing what is left in them (conmon's group stays busy a moment)."""
    if not d.is_dir():
        return
    for child in [p for p in d.iterdir() if p.is_dir()]:
        _kill_and_rmdir(child, version, tries)
    for _ in range(tries):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if version == 2 and (d / "cgroup.kill").exists():
                (d / "cgroup.kill").write_text("1")
            else:
                for pid in (d / "cgroup.procs").read_text().split() if (d / "cgroup.procs").exists() else []:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.05)


def _rmdir_if_empty(d: Path, tries: int = 20) -> None:
    for _ in range(tries):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:  # ENOTEMPTY: another group's children; leave it
                return
            time.sleep(0.05)


def read_int(path: Path) -> int | None:
    """A cgroup limit file: an integer, None for ``max`` (v2's unlimited)."""
    text = path.read_text().strip()
    return None if text == "max" else int(text)


def keyed(path: Path) -> dict[str, int]:
    """A flat keyed file (memory.stat, memory.events, memory.oom_control)."""
    out = {}
    for line in path.read_text().splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


def ns_inode(pid: int, kind: str) -> int:
    """The inode of /proc/PID/ns/KIND (``pid:[4026532181]``)."""
    return int(os.readlink(f"/proc/{pid}/ns/{kind}").split("[")[1].rstrip("]"))


# -- containers -----------------------------------------------------------------------------


def init_argv(cid: str, command: list[str]) -> list[str]:
    """The container's PID 1: run *command*, leave its output and status in /out, then wait.

    Nothing is run through ``exec``: in the VM's guest the mount namespace's root is the
    initramfs (the guest chroots into the host's root), and a process that joins the container's
    mount namespace (``runc exec``, ``podman exec``) lands there instead of in the rootfs. The
    container keeps running after the command, so its group can still be read from outside.
    """
    out = f"/out/{cid}"
    script = (
        f"{shlex.join(command)} > {out}.out 2> {out}.err; echo $? > {out}.tmp && mv {out}.tmp {out}.rc; exec sleep 3600"
    )
    return ["sh", "-c", script]


@dataclass(frozen=True)
class Finished:
    """What the container's command did: its exit status and output."""

    rc: int
    stdout: str
    stderr: str


class Container:
    """A started container: wait for its command, read its group's files from outside, stop it."""

    def __init__(self, lab: Lab, runtime: str, cid: str, cgroup_path: str) -> None:
        self.lab = lab
        self.runtime = runtime
        self.id = cid
        self.cgroup_path = cgroup_path
        self.dir = lab.hier.dir(cgroup_path)  # the container's memory group, seen from outside
        self.stopped = False

    def out(self, suffix: str) -> Path:
        """A file of this container in /out (inside) = ``lab.out`` (outside)."""
        return self.lab.out / f"{self.id}{suffix}"

    def wait(self, timeout: float = TIMEOUT_S) -> Finished:
        rc_file = self.out(".rc")
        wait_until(rc_file.exists, timeout=timeout, what=f"{self.runtime} container {self.id}: its command's end")
        return Finished(int(rc_file.read_text()), self.out(".out").read_text(), self.out(".err").read_text())

    def report(self) -> dict[str, Any]:
        """The report of ``oomguard check --json`` run as the container's command (``check_in``)."""
        done = self.wait()
        assert "Traceback" not in done.stderr, done.stderr
        assert done.rc == 0 and done.stdout.strip(), f"check exited {done.rc}: {done.stderr}"
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    def pids(self) -> list[int]:
        """Host PIDs of every process in the container's group."""
        return [int(p) for p in (self.dir / "cgroup.procs").read_text().split()]

    def find(self, argv: list[str], timeout: float = TIMEOUT_S) -> int:
        """The host PID of the process of this container whose command line is *argv*."""

        def found() -> int | None:
            for pid in self.pids():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1]
                except (FileNotFoundError, ProcessLookupError):
                    continue
                if cmdline == argv:
                    return pid
            return None

        try:
            pid = wait_until(found, timeout=timeout, what=f"process {argv!r} in {self.dir}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None
        assert pid is not None  # wait_until returns a truthy value
        return pid

    def describe(self) -> str:
        """What the group holds now (each PID's command line and state) and what this container
        wrote to /out: for a failure's message."""
        lines = []
        try:
            pids = self.pids()
        except OSError as exc:
            pids = []
            lines.append(f"  cgroup.procs: {exc}")
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError as exc:
                cmd, state = f"({exc.strerror})", "?"
            lines.append(f"  pid {pid} [{state}] {cmd}")
        for name in ("memory.events", "memory.current", "memory.stat"):
            try:
                text = (self.dir / name).read_text()
            except OSError:
                continue
            if name == "memory.stat":
                text = " ".join(line for line in text.splitlines() if line.split()[0] in ("anon", "file", "shmem"))
            lines.append(f"  {name}: {' '.join(text.split())}")
        for f in sorted(self.lab.out.iterdir()):
            if f.is_file() and f.stat().st_size < 20_000:
                lines.append(f"  /out/{f.name}: {f.read_text(errors='replace')[-1500:]!r}")
        return "\n".join(lines)

    def namespaces(self) -> dict[str, int]:
        """Inodes of the pid and cgroup namespaces of the container's processes, read from outside."""
        pid = self.pids()[0]
        return {kind: ns_inode(pid, kind) for kind in ("pid", "cgroup")}

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.lab.stop(self)


class Lab:
    """One session's runtimes: rootfs, state directories, the session group; ``close`` removes all.

    *hier* is the memory hierarchy and this process's writable group in it; every container's
    group lies under ``<own>/og-rt-<hex>/p<n>/`` (``parent``). runc and crun containers are deleted
    as each test ends, podman's all at once in ``close`` (under TCG each podman start costs seconds).
    """

    def __init__(self, hier: Hierarchy, workdir: Path) -> None:
        self.hier = hier
        self.workdir = workdir
        self.out = workdir / "out"  # /out inside every container
        self.out.mkdir(parents=True)
        self.oci_rootfs = make_rootfs(workdir / "rootfs")
        self.podman_rootfs = make_rootfs(workdir / "podman-rootfs")  # podman writes into its rootfs
        # podman refuses a runroot path longer than 50 characters (pytest's temp paths are)
        self.podman_state = Path(tempfile.mkdtemp(prefix="og-podman-"))
        # conmon's exit command (`podman container cleanup`) drops --runtime-flag: its runc may make
        # the default /run/runc, empty; removed in close if it was not there before
        self._default_runc_root = None if RUNC_DEFAULT_ROOT.exists() else RUNC_DEFAULT_ROOT
        self.session = f"{hier.own.rstrip('/')}/og-rt-{uuid.uuid4().hex[:8]}"
        # v1: the runtimes make the path in every hierarchy; note what was there before.
        self._others = other_hierarchies() if hier.version == 1 else []
        self._existed = {m: self._present(m) for m in [hier.mount, *self._others]}
        hier.dir(self.session).mkdir()
        if hier.version == 2:
            _enable_memory(hier.dir(self.session))
        self.containers: list[Container] = []
        self.unusable: dict[str, str] = {}  # runtime -> why it cannot start a container here
        self.started: set[str] = set()  # runtimes that have started one
        self._n = 0

    def _present(self, mount: Path) -> set[str]:
        """Which ancestors of the session group (and podman's default ``libpod_parent``) exist."""
        parts = self.session.strip("/").split("/")
        names = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)] + ["libpod_parent"]
        return {n for n in names if (mount / n).is_dir()}

    def parent(self, limit: int | None = None) -> str:
        """A new group under the session group (a container's parent), limited to *limit*; its cgroup path."""
        self._n += 1
        path = f"{self.session}/p{self._n}"
        d = self.hier.dir(path)
        d.mkdir()
        if self.hier.version == 2:
            _enable_memory(d)
        if limit is not None:
            (d / ("memory.limit_in_bytes" if self.hier.version == 1 else "memory.max")).write_text(str(limit))
        return path

    # -- runtimes --------------------------------------------------------------------------

    def base_argv(self, runtime: str) -> list[str]:
        state = self.workdir / "state" / runtime
        pstate = self.podman_state
        if runtime == "runc":
            return ["runc", "--root", str(state)]
        if runtime == "crun":
            argv = ["crun", "--root", str(state)]
            if hybrid_unified():  # crun: "cgroups in hybrid mode not supported"
                script = 'umount /sys/fs/cgroup/unified && exec "$@"'
                return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *argv]
            return argv
        return [
            "podman",
            "--root", str(pstate / "storage"),
            "--runroot", str(pstate / "run"),
            "--tmpdir", str(pstate / "tmp"),
            "--cgroup-manager=cgroupfs",
            "--runtime=runc",
            f"--runtime-flag=root={pstate / 'runc'}",  # not the host's /run/runc
            "--storage-driver=vfs",
            "--events-backend=none",
        ]  # fmt: skip

    def usable(self, runtime: str) -> str | None:
        """None, or why *runtime* cannot start a container here: not installed, or its first start
        failed (``start``). No container is spent on finding out: under TCG each costs seconds."""
        if runtime not in self.unusable and shutil.which(runtime) is None:
            self.unusable[runtime] = f"{runtime} is not installed (scripts/system-deps.sh installs it)"
        return self.unusable.get(runtime)

    def start(
        self,
        runtime: str,
        parent: str,
        command: list[str],
        limits: Limits = Limits(),
        *,
        cgroupns: bool = False,
    ) -> Container:
        """Start a container of *runtime* under *parent* running *command* (``init_argv``).

        Its group is ``<parent>/<id>`` (podman: ``<parent>/libpod-<full id>``); *cgroupns* gives it
        a private cgroup namespace.
        """
        cid = f"og-{uuid.uuid4().hex[:10]}"
        if runtime == "podman":
            return self._start_podman(cid, parent, command, limits, cgroupns)
        c = Container(self, runtime, cid, f"{parent}/{cid}")
        bundle = self.workdir / "bundles" / cid
        bundle.mkdir(parents=True)
        cfg = bundle_config(self.oci_rootfs, self.out, c.cgroup_path, limits, cgroupns)
        cfg["process"]["args"] = init_argv(cid, command)
        (bundle / "config.json").write_text(json.dumps(cfg, indent=1))
        self.containers.append(c)
        self._run([*self.base_argv(runtime), "run", "--detach", "--bundle", str(bundle), cid], runtime, bundle)
        return c

    def _start_podman(self, cid: str, parent: str, command: list[str], limits: Limits, cgroupns: bool) -> Container:
        volumes = [f"--volume={b}:{b}:ro" for b in _binds()] + [f"--volume={self.out}:/out:rw"]
        env = [f"--env={e}" for e in container_env()]
        argv = [
            *self.base_argv("podman"), "run", "--detach", "--name", cid, "--network=none",
            "--ulimit=nofile=1024:1024", "--ulimit=nproc=4096:4096",
            f"--cgroup-parent={parent}", f"--cgroupns={'private' if cgroupns else 'host'}",
            "--tmpfs=/tmp:rw,nosuid,nodev", *limits.podman(), *volumes, *env,
            "--rootfs", str(self.podman_rootfs), *init_argv(cid, command),  # --rootfs: the "image" is a directory
        ]  # fmt: skip
        c = Container(self, "podman", cid, parent)  # its group is known once podman has said the full id
        self.containers.append(c)
        full_id = self._run(argv, "podman", self.workdir / "bundles" / cid).strip().splitlines()[-1]
        c.cgroup_path = f"{parent}/libpod-{full_id}"
        c.dir = self.hier.dir(c.cgroup_path)
        return c

    def _run(self, argv: list[str], runtime: str, where: Path) -> str:
        """Run a runtime's start command; podman's stdout (the container's id).

        runc and crun hand their own stdio to the container's PID 1, which keeps it open: no pipe
        to wait on there, a file for stderr instead. The start command runs in *where*: podman's
        conmon, which stays in the directory it was started in, marks each OOM event of the
        container with ``open("oom", O_CREAT, 0666)`` there (conmon's OOM handler), which left an
        empty ``oom`` in the checkout's root after every full run.
        """
        where.mkdir(parents=True, exist_ok=True)
        err = where / "runtime.stderr"
        out = subprocess.PIPE if runtime == "podman" else subprocess.DEVNULL
        with err.open("w") as f:
            proc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=f, text=True, timeout=TIMEOUT_S, cwd=where
            )
        if proc.returncode != 0:
            why = f"{argv[0]} exited {proc.returncode}: {err.read_text().strip()[-1500:]}"
            if runtime not in self.started:  # it never could: say why and skip, here and after
                import pytest

                self.unusable[runtime] = why
                pytest.skip(f"{runtime} cannot start a container here: {why}")
            raise RuntimeFailed(runtime, why)
        self.started.add(runtime)
        return proc.stdout or ""

    def stop(self, c: Container) -> None:
        """runc and crun: delete now. podman: left running until ``close`` removes them all in one
        ``podman rm`` (under TCG each podman start costs seconds)."""
        if c.runtime != "podman":
            subprocess.run(
                [*self.base_argv(c.runtime), "delete", "--force", c.id], capture_output=True, timeout=TIMEOUT_S
            )

    def _remove_podman(self) -> None:
        ids = [c.id for c in self.containers if c.runtime == "podman"]
        if ids:
            argv = [*self.base_argv("podman"), "rm", "--force", "--time=0", *ids]
            subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S)

    def close(self) -> None:
        """Every container deleted, every group removed (in every v1 hierarchy the runtimes touched)."""
        for c in self.containers:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                c.stop()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self._remove_podman()
        for mount in [self.hier.mount, *self._others]:
            _kill_and_rmdir(mount / self.session.lstrip("/"), self.hier.version)
        parts = self.session.strip("/").split("/")
        # What the runtimes made above the session group (v1: in every hierarchy), and podman's
        # default parent: removed only when empty (never what was there before, never a process).
        above = ["/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]
        for mount in [self.hier.mount, *self._others]:
            for rel in [*above, "libpod_parent/conmon", "libpod_parent"]:
                if rel.split("/")[0] != "libpod_parent" and rel in self._existed[mount]:
                    continue
                if rel.startswith("libpod_parent") and "libpod_parent" in self._existed[mount]:
                    continue
                _rmdir_if_empty(mount / rel)
        if self._default_runc_root is not None:  # after the groups: no cleanup process is left
            _rmdir_if_empty(self._default_runc_root)
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.podman_state, ignore_errors=True)


def _enable_memory(d: Path) -> None:
    if "memory" not in (d / "cgroup.subtree_control").read_text().split():
        (d / "cgroup.subtree_control").write_text("+memory")


class RuntimeFailed(Exception):
    """A runtime that has started containers here failed to start one: a failure, not a skip."""

    def __init__(self, runtime: str, message: str) -> None:
        super().__init__(message)
        self.runtime = runtime


UNLIMITED_V1 = 1 << 62  # v1 writes LONG_MAX rounded down to the page size


def _v1(n: int | None) -> int | None:
    return None if n is None or n >= UNLIMITED_V1 else n


def kernel_limits(c: Container) -> dict[str, int | None]:
    """The kernel's numbers of *c*'s group and its parent, read from outside (None: unlimited)."""
    d, parent = c.dir, c.dir.parent
    if c.lab.hier.version == 1:
        stat = keyed(d / "memory.stat")
        memsw = d / "memory.memsw.limit_in_bytes"
        return {
            "limit": _v1(read_int(d / "memory.limit_in_bytes")),
            "parent_limit": _v1(read_int(parent / "memory.limit_in_bytes")),
            "hierarchical": _v1(stat["hierarchical_memory_limit"]),  # folds in every ancestor
            "hierarchical_memsw": _v1(stat.get("hierarchical_memsw_limit")),
            "memsw": _v1(read_int(memsw)) if memsw.exists() else None,
            "soft_limit": _v1(read_int(d / "memory.soft_limit_in_bytes")),
            "oom_kill": keyed(d / "memory.oom_control").get("oom_kill"),
        }
    swap = d / "memory.swap.max"
    return {
        "limit": read_int(d / "memory.max"),
        "parent_limit": read_int(parent / "memory.max"),
        "swap_max": read_int(swap) if swap.exists() else None,
        "low": read_int(d / "memory.low"),
        "oom_kill": keyed(d / "memory.events").get("oom_kill"),
    }


def mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


# -- the cases, graded against the kernel's numbers -------------------------------------------

OTHER_RUNTIME = "container-other"  # src/oomguard/probes/container.py: systemd's name for a bare namespace


def check_argv() -> list[str]:
    return [python_exe(), "-m", "oomguard", "check", "--json"]


@dataclass
class Checked:
    """One ``oomguard check`` in a container, with what the kernel said from outside meanwhile."""

    report: dict[str, Any]
    kernel: dict[str, int | None]
    ceiling: int | None  # the lowest limit the container can see (None: none)
    swap_ceiling: int | None  # v1: the lowest memory+swap limit; v2: the lowest memory.swap.max it can see
    cgroupns: bool  # a private cgroup namespace
    hidden: bool  # ancestors' limits cannot be seen (v2, private cgroup namespace)
    container: Container
    namespaces: dict[str, int]


def check_in(
    lab: Lab, runtime: str, limits: Limits = Limits(), *, parent_limit: int | None = None, cgroupns: bool
) -> Checked:
    """Start a container of *runtime* (its parent group limited to *parent_limit*) running
    ``oomguard check --json``; read its group from outside while it is still there."""
    c = lab.start(runtime, lab.parent(parent_limit), check_argv(), limits, cgroupns=cgroupns)
    try:
        report = c.report()
        kernel = kernel_limits(c)
        hidden = lab.hier.version == 2 and cgroupns
        if lab.hier.version == 2:
            ceiling = visible_ceiling(c, "memory.max", hidden)
            swap_ceiling = visible_ceiling(c, "memory.swap.max", hidden)
        else:
            ceiling, swap_ceiling = kernel["hierarchical"], kernel["hierarchical_memsw"]
        return Checked(report, kernel, ceiling, swap_ceiling, cgroupns, hidden, c, c.namespaces())
    finally:
        c.stop()


def visible_ceiling(c: Container, name: str, hidden: bool) -> int | None:
    """v2: the smallest *name* (``memory.max``, ``memory.swap.max``) from the container's group up to
    the mount point, or of its own group alone where a private cgroup namespace hides the rest."""
    dirs = [c.dir]
    while not hidden and dirs[-1] != c.lab.hier.mount:
        dirs.append(dirs[-1].parent)
    values = [read_int(d / name) for d in dirs if (d / name).exists()]
    known = [v for v in values if v is not None]
    return min(known) if known else None


def assert_applied(checked: Checked, limits: Limits) -> None:
    """The runtime wrote what was asked (the setting, not oomguard, is what this checks)."""
    k, v1 = checked.kernel, checked.container.lab.hier.version == 1
    assert k["limit"] == limits.limit, k
    if limits.swap is not None:
        if v1:
            assert k["memsw"] == limits.swap, k
        else:
            assert limits.limit is not None and k["swap_max"] == limits.swap - limits.limit, k
    if limits.reservation is not None:
        assert k["soft_limit" if v1 else "low"] == limits.reservation, k


def assert_detected(checked: Checked) -> None:
    """runc and crun leave no marker: their namespaces must give them away; podman is podman."""
    ctr, ns, runtime = checked.report["container"], checked.namespaces, checked.container.runtime
    assert ctr["in_container"] is True, ctr
    assert ns["pid"] != INITIAL_PID_NS  # what the runtime did, seen from outside
    assert (ns["cgroup"] != INITIAL_CGROUP_NS) is checked.cgroupns, ns
    assert ctr["runtime"] == ("podman" if runtime == "podman" else OTHER_RUNTIME), ctr
    named = [
        e for e in ctr["evidence"] if e.startswith("namespace:") and (f"[{ns['pid']}]" in e or f"[{ns['cgroup']}]" in e)
    ]
    if runtime == "podman":
        assert any("/run/.containerenv" in e for e in ctr["evidence"]), ctr
    else:
        assert named, (
            f"no evidence names the container's pid namespace {ns['pid']} or cgroup namespace {ns['cgroup']}: {ctr}"
        )


def grade(checked: Checked) -> None:
    """Everything the report says about memory, against the kernel's numbers read from outside."""
    report, k, c = checked.report, checked.kernel, checked.container
    version = c.lab.hier.version
    mem, cg = report["memory"], report["memory"]["cgroup"]
    codes = [w["code"] for w in report["warnings"]]
    total = mem_total()
    assert mem["host_total_bytes"] == total
    assert cg["version"] == version
    ceiling = checked.ceiling
    binds = ceiling is not None and ceiling < total
    assert mem["effective_bytes"] == (ceiling if binds else total), (mem, k)
    assert mem["limited_by"] == (f"cgroup-v{version}" if binds else "meminfo"), mem
    assert cg["limit_bytes"] == ceiling, (cg, k)
    assert cg["ancestors_visible"] is (not checked.hidden), cg
    # systemd#19497: a limit above the namespace root cannot be seen, and the report must say so.
    assert ("limit-may-be-hidden" in codes) is (not cg["ancestors_visible"]), report["warnings"]
    swap = mem["swap"]
    if version == 1:
        memsw = checked.swap_ceiling
        assert swap["memsw_limit_bytes"] == memsw, (swap, k)
        assert swap["limit_bytes"] == (max(0, memsw - ceiling) if memsw is not None and ceiling is not None else None)
    else:
        assert swap["limit_bytes"] == checked.swap_ceiling, (swap, k)
        assert mem["protection"]["low_bytes"] == k["low"], (mem["protection"], k)
    assert_detected(checked)


# -- oomguard run inside a container ----------------------------------------------------------


@dataclass
class RunStep:
    rc: int
    events: list[dict[str, Any]]
    stderr: str

    @property
    def exit(self) -> dict[str, Any]:
        ends = [e for e in self.events if e["event"] == "exit"]
        assert len(ends) == 1, (self.events, self.stderr)
        return ends[0]


@dataclass
class Runs:
    """``oomguard run``s one after the other in one container; the kernel's numbers after them."""

    steps: dict[str, RunStep]
    kernel_oom_kills: int | None
    kernel_limit: int | None


KILLED_FROM_OUTSIDE = ["sleep", "300"]  # the container's PID 1 ends as `sleep 3600`: not this
# The outsider's parent: it never reaps it, so the OOM-killed outsider stays a zombie until the
# worker has seen it die, as in tests/integration/test_run.py (pytest reaps it only at the end). The container's
# shell would reap it at once, and KILLED_9's alive() then races the reaping: a read of
# /proc/PID/stat opened just before fails with ESRCH, which it does not catch.
KEEP_ZOMBIE = "import os, sys, time\nif os.fork() == 0: os.execv(sys.argv[1], sys.argv[1:])\ntime.sleep(600)\n"


def runs_in(lab: Lab, runtime: str, *, cgroupns: bool, beside_oom: bool, limit: int = 64 * MiB) -> Runs:
    """In one container limited to *limit* (no swap), each under its own ``oomguard run``:

    - ``oom-worker``: the worker allocates (``tail /dev/zero`` keeps all it reads) until the
      kernel's OOM killer ends it;
    - ``oom-descendant``: the worker is a shell whose child does that (``|| exit 3``);
    - ``kill-9``: the worker is killed with SIGKILL from outside the container, after the group
      has seen two OOM kills;
    - with *beside_oom*, ``kill-9-beside-oom``: tests/helpers/workers.py's ``KILLED_9`` kills itself
      while ``OUTSIDER``, another process of the container outside the supervisor's tree, is
      OOM-killed.

    The budget is explicit (the auto budget's 256 MiB margin would leave nothing of *limit*), and
    *limit* small: under TCG, filling 192 MiB until the OOM kill takes seconds.
    """
    from tests.helpers.workers import KILLED_9, OUTSIDER

    tag = f"run-{uuid.uuid4().hex[:8]}"
    py = python_exe()

    def run(name: str, argv: list[str], tail: str = "") -> str:
        events = f"/out/{tag}-{name}.jsonl"
        cmd = [py, "-m", "oomguard", "run", "--events", events, "--restart", "never", "--budget", "32MiB", "--", *argv]
        return f"{shlex.join(cmd)}{tail} 2> /out/{tag}-{name}.err; echo $? > /out/{tag}-{name}.rc"

    steps = [
        run("oom-worker", ["tail", "/dev/zero"]),
        run("oom-descendant", ["sh", "-c", "tail /dev/zero || exit 3"]),
        run("kill-9", KILLED_FROM_OUTSIDE),
    ]
    if beside_oom:
        pid_file, go = f"/out/{tag}-outsider", f"/out/{tag}-go"
        steps += [
            f"{shlex.join([py, '-c', KEEP_ZOMBIE, py, '-c', OUTSIDER, pid_file, go])} &",
            f"while [ ! -s {pid_file} ]; do sleep 0.02; done",
            run("kill-9-beside-oom", [py, "-c", KILLED_9, go], f' "$(cat {pid_file})"'),
            "kill $!; wait",
        ]
    script = "\n".join(steps)
    c = lab.start(runtime, lab.parent(), ["sh", "-c", script], Limits(limit=limit, swap=limit), cgroupns=cgroupns)
    try:
        # From outside the container: an operator's kill -9. Its step starts after two whole runs
        # that each fill 64 MiB until the OOM kill: 60-80 s under TCG on an idle host, past the
        # default 120 s beside a loaded one (CI's run twice), so these waits are longer.
        os.kill(c.find(KILLED_FROM_OUTSIDE, timeout=5 * TIMEOUT_S), signal.SIGKILL)
        done = c.wait(timeout=3 * TIMEOUT_S)
        assert done.rc == 0, done
        kernel = kernel_limits(c)
    finally:
        c.stop()
    names = ["oom-worker", "oom-descendant", "kill-9"] + (["kill-9-beside-oom"] if beside_oom else [])
    results = {}
    for name in names:
        ev = lab.out / f"{tag}-{name}.jsonl"
        events = [json.loads(line) for line in ev.read_text().splitlines()] if ev.exists() else []
        rc = int((lab.out / f"{tag}-{name}.rc").read_text())
        results[name] = RunStep(rc, events, (lab.out / f"{tag}-{name}.err").read_text())
    return Runs(results, kernel["oom_kill"], kernel["limit"])


# -- the cases (the host's suite and the VM's guest checks both run them) -----------------------


def case_limits(lab: Lab, runtime: str, limits: Limits, *, cgroupns: bool) -> None:
    """A limit, and with it swap and/or a reservation, set by the runtime in an unlimited parent.

    The container's own limit is the ceiling: swap does not raise it, and a reservation (v1's soft
    limit, v2's ``memory.low``) is a reclaim target or a protection, never a cap.
    """
    assert limits.limit is not None
    checked = check_in(lab, runtime, limits, cgroupns=cgroupns)
    assert_applied(checked, limits)
    grade(checked)
    mem = checked.report["memory"]
    assert checked.ceiling == checked.kernel["limit"]
    assert mem["effective_bytes"] == checked.kernel["limit"], mem
    if limits.swap is not None:
        assert mem["swap"]["known"] is True
        assert mem["swap"]["limit_bytes"] == limits.swap - limits.limit, mem["swap"]
    if limits.reservation is not None:
        assert mem["effective_bytes"] > limits.reservation


def case_parent_below(lab: Lab, runtime: str, *, cgroupns: bool) -> None:
    """The parent's limit (200 MiB) is below the container's (300 MiB).

    v1: ``memory.stat``'s ``hierarchical_memory_limit`` shows it through any cgroup namespace.
    v2: the host's namespace shows it; a private one hides it, and the report must say so.
    """
    limits = Limits(limit=300 * MiB)
    checked = check_in(lab, runtime, limits, parent_limit=200 * MiB, cgroupns=cgroupns)
    assert_applied(checked, limits)
    assert checked.kernel["parent_limit"] == 200 * MiB
    grade(checked)
    seen = checked.kernel["limit"] if checked.hidden else checked.kernel["parent_limit"]
    assert checked.report["memory"]["effective_bytes"] == seen


def case_parent_only(lab: Lab, runtime: str, *, cgroupns: bool) -> None:
    """A parent limit (200 MiB) and none on the container."""
    checked = check_in(lab, runtime, Limits(), parent_limit=200 * MiB, cgroupns=cgroupns)
    assert checked.kernel["limit"] is None and checked.kernel["parent_limit"] == 200 * MiB, checked.kernel
    grade(checked)
    mem = checked.report["memory"]
    if checked.hidden:
        assert mem["limited_by"] == "meminfo"
    else:
        assert mem["effective_bytes"] == checked.kernel["parent_limit"], mem


def case_run_oom_worker(runs: Runs, version: int) -> None:
    step = runs.steps["oom-worker"]
    assert step.rc == 137, step.stderr
    start, end = step.events[0], step.exit
    assert (start["event"], start["effective_bytes"], start["limited_by"]) == (
        "start",
        runs.kernel_limit,
        f"cgroup-v{version}",
    ), start
    assert (end["reason"], end["signal"], end["oom_victim"], end["oom_kills"]) == ("oom-kill", 9, "worker", 1), end


def case_run_oom_descendant(runs: Runs) -> None:
    step = runs.steps["oom-descendant"]
    assert step.rc == 3, step.stderr  # the wrapper's own status, passed on
    end = step.exit
    assert (end["reason"], end["oom_victim"], end["exit_code"], end["oom_kills"]) == (
        "oom-kill",
        "descendant",
        3,
        1,
    ), end


def case_run_kill_9(runs: Runs) -> None:
    """After two OOM kills in the same group, an operator's kill -9 from outside is still no OOM kill."""
    step = runs.steps["kill-9"]
    assert step.rc == 137, step.stderr
    end = step.exit
    assert (end["reason"], end["signal"], end["oom_kills"], end["oom_victim"]) == ("signal", 9, 0, None), end
    counted = sum(s.exit["oom_kills"] for s in runs.steps.values())
    assert runs.kernel_oom_kills == counted == len(runs.steps) - 1  # the kernel's count, read from outside


def case_run_kill_9_beside_oom(runs: Runs) -> None:
    """The worker kills itself -9 while another process of the container is OOM-killed: not blamed
    on the OOM killer, though the group's OOM kill is counted and said."""
    step = runs.steps["kill-9-beside-oom"]
    assert step.rc == 137, step.stderr
    end = step.exit
    assert (end["reason"], end["signal"], end["oom_victim"], end["oom_kills"]) == ("signal", 9, "group", 1), end
    assert "oom_kill +1" in end["message"], end
