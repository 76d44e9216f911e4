"""The VM harness's own parts, on the host, without booting anything."""

from __future__ import annotations

import lzma
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.vm import harness

V = "kernel/drivers/virtio/"
DEP = "\n".join(
    [
        "kernel/fs/9p/9p.ko.xz: kernel/fs/netfs/netfs.ko.xz kernel/net/9p/9pnet.ko.xz kernel/fs/fscache/fscache.ko.xz",
        "kernel/fs/netfs/netfs.ko.xz:",
        "kernel/fs/fscache/fscache.ko.xz: kernel/fs/netfs/netfs.ko.xz",
        "kernel/net/9p/9pnet.ko.xz:",
        f"kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz {V}virtio.ko.xz {V}virtio_ring.ko.xz",
        f"{V}virtio.ko.xz: {V}virtio_ring.ko.xz",
        f"{V}virtio_ring.ko.xz:",
        f"{V}virtio_pci.ko.xz: {V}virtio_pci_legacy_dev.ko.xz {V}virtio_pci_modern_dev.ko.xz {V}virtio.ko.xz "
        f"{V}virtio_ring.ko.xz",
        f"{V}virtio_pci_legacy_dev.ko.xz:",
        f"{V}virtio_pci_modern_dev.ko.xz:",
        f"kernel/drivers/other.ko.xz: {V}virtio.ko.xz",
    ]
)


def _fake_kernel(tmp_path: Path) -> harness.Kernel:
    mods = tmp_path / "lib/modules/9.9.9-test"
    for line in DEP.splitlines():
        rel = line.split(":")[0]
        (mods / rel).parent.mkdir(parents=True, exist_ok=True)
        (mods / rel).write_bytes(lzma.compress(f"module {rel}".encode()))
    (mods / "modules.dep").write_text(DEP)
    return harness.Kernel("9.9.9-test", tmp_path / "vmlinuz-9.9.9-test", mods)


def test_modules_come_after_what_they_need(tmp_path: Path) -> None:
    order = harness.module_order(_fake_kernel(tmp_path).modules)
    names = [harness._name(m) for m in order]
    virtio = ["virtio_pci", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio", "virtio_ring"]
    # each once, and nothing that is not needed ("other")
    assert sorted(names) == sorted([*virtio, "9pnet_virtio", "9pnet", "9p", "netfs", "fscache"])
    for line in DEP.splitlines():
        mod, _, deps = line.partition(":")
        if mod in order:
            assert all(order.index(d) < order.index(mod) for d in deps.split()), mod


def test_a_missing_module_means_unavailable(tmp_path: Path) -> None:
    kernel = _fake_kernel(tmp_path)
    with pytest.raises(harness.Unavailable, match="nope"):
        harness.module_order(kernel.modules, ("nope",))


@pytest.mark.skipif(shutil.which("cpio") is None, reason="cpio is not installed (scripts/system-deps.sh)")
def test_initramfs_is_a_newc_archive_with_decompressed_modules(tmp_path: Path) -> None:
    try:
        harness.busybox_binary()
    except harness.Unavailable as exc:
        pytest.skip(str(exc))
    kernel = _fake_kernel(tmp_path)
    image = harness.build_initramfs(kernel, tmp_path / "cache")
    assert harness.build_initramfs(kernel, tmp_path / "cache") == image  # cached
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    # GNU cpio, independently of the writer, reads it back; the device node needs root.
    subprocess.run(["cpio", "-idm", "--quiet", "--no-absolute-filenames"], input=image.read_bytes(), cwd=unpacked,
                   check=False, capture_output=True, timeout=60)  # fmt: skip
    assert (unpacked / "init").read_text().startswith("#!/bin/busybox sh")
    assert (unpacked / "init").stat().st_mode & 0o111
    assert (unpacked / "bin/busybox").stat().st_size > 100_000
    order = (unpacked / "modules.order").read_text().split()
    assert order[-1] == "9p.ko"
    assert (unpacked / "modules/9p.ko").read_bytes() == b"module kernel/fs/9p/9p.ko.xz"


def test_no_kernel_means_unavailable(tmp_path: Path) -> None:
    with pytest.raises(harness.Unavailable, match="linux-image-amd64"):
        harness.find_kernel(tmp_path / "boot", tmp_path / "lib")
