"""Boot a real cgroup v2 kernel under qemu and run a pytest selection inside it.

The recipe (verified on this project's machines; QEMU documentation, "9p / virtfs" and "-accel"):
- Debian's generic ``linux-image-amd64`` (the ``-cloud-`` flavour has no 9p), booted by
  ``qemu-system-x86_64 -accel tcg -cpu max``: KVM exists here but a KVM guest hangs after
  "Booting from ROM", so TCG it is.
- The host's root is shared read-only over virtio-9p; a second, writable 9p share of a host
  temp dir carries the per-run script in and the results out.
- The initramfs is busybox-static plus the virtio/9p modules in dependency order (from
  ``modules.dep``, decompressed when shipped as ``.ko.xz``), and an ``/init`` that mounts the
  host root at /host, proc, sysfs, devtmpfs and cgroup2 under it (memory controller enabled at
  the root), tmpfs for every place a test writes, chroots into /host and runs the per-run
  script, then powers off.

Nothing here imports oomguard: the harness must not grade the probe with its own logic.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Modules the guest needs, by name; their dependencies come from modules.dep.
WANTED_MODULES = ("virtio_pci", "9pnet_virtio", "9p")
MEMORY_MIB = 1024
READY = "OOMGUARD-VM-READY"
DONE = "OOMGUARD-VM-DONE"
GUEST_OUT = "/tmp/vm"  # where the writable share is mounted, seen from inside the chroot

# /init of the initramfs: generic (cached by kernel version); the per-run work is run.sh in the share.
INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.order); do insmod /modules/$m || echo "init: insmod $m failed"; done
mkdir -p /host
# The host root, read-only: cache=loose is safe (nothing changes under us) and much faster.
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro host /host || {{
  echo "init: cannot mount the host root"; poweroff -f; }}
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts
mount -t tmpfs tmpfs /host/dev/shm
# systemd's options on Debian 12 / Ubuntu 22.04+ hosts.
mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /host/sys/fs/cgroup
echo +memory > /host/sys/fs/cgroup/cgroup.subtree_control
mkdir -p /out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=none out /out || {{
  echo "init: cannot mount the results share"; poweroff -f; }}
# The host paths the run needs (the checkout, the venv) stay visible even when they lie under a
# directory the tmpfs mounts below hide (a CI clone in /tmp): bound aside first, bound back after.
for p in $(cat /out/keep 2>/dev/null); do mkdir -p /keep$p && mount -o bind /host$p /keep$p; done
for d in /tmp /run /var/tmp; do mount -t tmpfs -o mode=1777 tmpfs /host$d; done
for p in $(cat /out/keep 2>/dev/null); do mkdir -p /host$p && mount -o bind /keep$p /host$p; done
mkdir -p /host{GUEST_OUT}
mount -o bind /out /host{GUEST_OUT}
: > /host{GUEST_OUT}/ready  # its mtime, on the host's clock, times the boot
echo "{READY} $(cat /proc/uptime) $(uname -r)"
chroot /host /bin/sh {GUEST_OUT}/run.sh
echo "{DONE} rc=$?"
sync
poweroff -f
"""


class Unavailable(Exception):
    """qemu or a bootable kernel is missing here: the VM suite is skipped, with this reason."""


@dataclass
class Kernel:
    version: str
    image: Path
    modules: Path  # /lib/modules/<version>


@dataclass
class Boot:
    """What one boot produced."""

    returncode: int | None  # qemu's; None on timeout
    console: str
    out: Path  # the writable share, as the host sees it
    boot_seconds: float | None  # qemu start -> READY marker
    wall_seconds: float
    guest_rc: int | None  # run.sh's status, from the DONE marker
    kernel: str | None  # uname -r inside
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)


def find_kernel(boot_dir: Path = Path("/boot"), lib: Path = Path("/lib/modules")) -> Kernel:
    """The newest /boot/vmlinuz-* whose modules include 9p, or Unavailable."""
    found = []
    for image in boot_dir.glob("vmlinuz-*"):
        version = image.name[len("vmlinuz-") :]
        mods = lib / version
        if list((mods / "kernel" / "fs" / "9p").glob("9p.ko*")):
            found.append(Kernel(version, image, mods))
    if not found:
        raise Unavailable(
            "no /boot/vmlinuz-* with 9p modules in /lib/modules/<version> "
            "(install linux-image-amd64: scripts/system-deps.sh; the -cloud- kernel has no 9p)"
        )
    return max(found, key=lambda k: [int(x) if x.isdigit() else 0 for x in re.split(r"[.-]", k.version)])


def qemu_binary() -> str:
    exe = shutil.which("qemu-system-x86_64")
    if exe is None:
        raise Unavailable("qemu-system-x86_64 is not installed (scripts/system-deps.sh installs qemu-system-x86)")
    return exe


def busybox_binary() -> Path:
    for cand in ("/bin/busybox", "/usr/bin/busybox"):
        p = Path(cand)
        if p.exists():
            # A dynamic busybox cannot run in an initramfs without its libraries.
            if b"ld-linux" in p.read_bytes()[: 4096 * 16]:
                continue
            return p
    raise Unavailable("no static busybox (scripts/system-deps.sh installs busybox-static)")


def module_order(modules: Path, wanted: tuple[str, ...] = WANTED_MODULES) -> list[str]:
    """Relative paths of *wanted* and their dependencies, each after everything it needs.

    modules.dep (depmod(8)): ``kernel/fs/9p/9p.ko: kernel/fs/netfs/netfs.ko kernel/net/9p/9pnet.ko``,
    one line per module, dependencies after the colon.
    """
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules / "modules.dep").read_text().splitlines():
        mod, _, rest = line.partition(":")
        deps[mod] = rest.split()
        by_name[_name(mod)] = mod
    order: list[str] = []

    def visit(mod: str, stack: tuple[str, ...]) -> None:
        if mod in order or mod in stack:
            return
        for d in deps.get(mod, []):
            visit(d, (*stack, mod))
        order.append(mod)

    for name in wanted:
        if name not in by_name:
            raise Unavailable(f"kernel module {name} is not in {modules}/modules.dep")
        visit(by_name[name], ())
    return order


def _name(mod_path: str) -> str:
    base = mod_path.rsplit("/", 1)[-1]
    return re.sub(r"\.ko(\.(xz|gz|zst))?$", "", base).replace("-", "_")


def _module_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    if path.name.endswith(".zst"):
        raise Unavailable(f"{path}: zstd-compressed modules are not supported by this harness")
    return data


class _Cpio:
    """A newc ("070701") cpio archive, the format the kernel unpacks as an initramfs."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.ino = 1

    def add(self, name: str, mode: int, data: bytes = b"") -> None:
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
        header = b"070701" + b"".join(b"%08x" % f for f in fields)
        entry = header + name.encode() + b"\0"
        entry += b"\0" * (-len(entry) % 4)
        entry += data + b"\0" * (-len(data) % 4)
        self.parts.append(entry)
        self.ino += 1

    def bytes(self) -> bytes:
        self.add("TRAILER!!!", 0)
        return b"".join(self.parts)


def build_initramfs(kernel: Kernel, cache_dir: Path | None = None) -> Path:
    """The initramfs for *kernel*, cached by kernel version and this harness's contents."""
    busybox = busybox_binary()
    order = module_order(kernel.modules)
    key = hashlib.sha256((INIT + "\n".join(order) + str(busybox.stat().st_size)).encode()).hexdigest()[:12]
    cache_dir = cache_dir or Path(tempfile.gettempdir()) / "oomguard-vm-cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"initramfs-{kernel.version}-{key}.cpio"
    if target.exists():
        return target
    cpio = _Cpio()
    for d in ("bin", "dev", "proc", "sys", "host", "modules"):
        cpio.add(d, 0o040755)
    cpio.add("dev/console", 0o020600)  # the kernel opens it for init before devtmpfs is mounted
    cpio.add("bin/busybox", 0o100755, busybox.read_bytes())
    cpio.add("init", 0o100755, INIT.encode())
    names = []
    for mod in order:
        name = _name(mod) + ".ko"
        names.append(name)
        cpio.add(f"modules/{name}", 0o100644, _module_bytes(kernel.modules / mod))
    cpio.add("modules.order", 0o100644, ("\n".join(names) + "\n").encode())
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(cpio.bytes())
    tmp.replace(target)
    for old in cache_dir.glob(f"initramfs-{kernel.version}-*.cpio"):  # earlier versions of this harness
        if old != target:
            old.unlink(missing_ok=True)
    return target


def boot(
    run_sh: str, out: Path, timeout: float = 420.0, cache_dir: Path | None = None, keep: tuple[str, ...] = ()
) -> Boot:
    """Boot once, run *run_sh* (a /bin/sh script, run chrooted in the host root) and power off.

    *out* is shared writable at /tmp/vm inside the guest; run.sh is written there. *keep*: host
    directories (absolute, no white space) that must stay visible in the guest even where they lie
    under /tmp, /run or /var/tmp, which the guest covers with tmpfs (the checkout, the venv).
    Raises Unavailable when qemu or the kernel cannot start at all.
    """
    qemu = qemu_binary()
    kernel = find_kernel()
    initrd = build_initramfs(kernel, cache_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.sh").write_text(run_sh)
    (out / "keep").write_text("".join(f"{k}\n" for k in keep if k.startswith("/") and not any(c.isspace() for c in k)))
    console_path = out / "console.log"
    cmd = [
        qemu,
        "-accel", "tcg",
        "-cpu", "max",
        "-m", str(MEMORY_MIB),
        "-smp", "1",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
        "-serial", f"file:{console_path}",
        "-kernel", str(kernel.image),
        "-initrd", str(initrd),
        "-append", "console=ttyS0 panic=-1 quiet loglevel=1",
        "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={out},mount_tag=out,security_model=none",
    ]  # fmt: skip
    (out / "ready").unlink(missing_ok=True)
    start, start_wall = time.monotonic(), time.time()
    timed_out = False
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        rc: int | None = proc.returncode
        stderr = proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, timed_out = None, True
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    wall = time.monotonic() - start
    console = console_path.read_text(errors="replace") if console_path.exists() else ""
    if rc not in (0, None) and not console.strip():
        raise Unavailable(f"qemu could not start (exit {rc}): {stderr.strip()[-500:]}")
    mtime = _marker_time(out / "ready")
    boot_seconds = None if mtime is None else mtime - start_wall
    ready = re.search(rf"{READY} (\S+) \S+ (\S+)", console)
    done = re.search(rf"{DONE} rc=(\d+)", console)
    result = Boot(
        returncode=rc,
        console=console,
        out=out,
        boot_seconds=boot_seconds,
        wall_seconds=wall,
        guest_rc=int(done.group(1)) if done else None,
        kernel=ready.group(2) if ready else None,
        timed_out=timed_out,
    )
    if stderr.strip():
        result.notes.append("qemu stderr: " + stderr.strip()[-2000:])
    return result


def _marker_time(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def pytest_script(repo: Path, python: str, args: list[str], timeout: int) -> str:
    """run.sh for the guest: pytest on *args* (relative to *repo*) with the guest configuration.

    Results come back in the share: results.json (tests/integration/vm/guest/report_plugin.py), junit.xml
    and pytest.log. Nothing is written to the read-only host root: no bytecode, no cache. No
    plugin is loaded but the guest's own (guest.ini's ``-p``): the guest tests use none, and the
    installed ones' imports (schemathesis, hypothesis, ...) took 1.6 s of the host's CPU per start,
    many times that under TCG.
    """
    path = f"{Path(python).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return f"""cd {repo} || exit 90
export HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8 PATH={path}
export PYTHONDONTWRITEBYTECODE=1 PYTHONPATH={repo}/src:{repo} PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
export VMTEST_GUEST=1 VMTEST_RESULTS={GUEST_OUT}/results.json
timeout -s KILL {timeout} {python} -m pytest -c tests/integration/vm/guest/guest.ini --rootdir {repo} \\
  --confcutdir {repo}/tests/integration/vm/guest --junitxml {GUEST_OUT}/junit.xml {" ".join(args)} \\
  > {GUEST_OUT}/pytest.log 2>&1
rc=$?
tail -n 40 {GUEST_OUT}/pytest.log
exit $rc
"""
