#!/usr/bin/env bash
# Debian packages the test suite needs; installs only what is missing (idempotent, quiet):
# - PostgreSQL (the manager's fleet database) and Chromium (dashboard tests);
# - qemu-system-x86, linux-image-amd64, busybox-static and cpio: the real cgroup v2 kernel the
#   VM suite boots (tests/integration/vm/; cpio reads its initramfs back in a test). The -cloud- kernel has
#   no 9p, so the generic one is needed.
# - zsh: the zsh completion script is tested in a real zsh (tests/commands/test_completion.py).
# - runc, crun and podman: real containers with memory limits set by the runtime, here and in the
#   VM (tests/integration/test_runtimes.py, tests/integration/vm/guest/check_runtimes.py). Root podman with --rootfs, vfs
#   storage and no network needs nothing of its Recommends (conmon is a Depends).
# Needs root for apt-get; without it, says what is missing and leaves the tests to skip.
set -euo pipefail
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
# The generic kernel with its 9p modules (a kernel image alone, e.g. the host's, is not enough).
ls /lib/modules/*/kernel/fs/9p/9p.ko* >/dev/null 2>&1 || need+=(linux-image-amd64)
# A static busybox: the initramfs's init runs it before any library is reachable.
[ "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" = "install ok installed" ] || need+=(busybox-static)
command -v cpio >/dev/null 2>&1 || need+=(cpio)
command -v zsh >/dev/null 2>&1 || need+=(zsh)
# runc lives in /usr/sbin, which a non-root PATH may lack.
for rt in runc crun podman; do
  command -v $rt >/dev/null 2>&1 || [ -x /usr/sbin/$rt ] || need+=($rt)
done
# nginx and Caddy: the reverse-proxy examples in deploy/proxy/ are run and validated (tests/integration/test_manager_hardening.py).
command -v nginx >/dev/null 2>&1 || need+=(nginx-light)
command -v caddy >/dev/null 2>&1 || need+=(caddy)
# Prometheus: it scrapes a real manager and answers every query of deploy/grafana/ (tests/integration/test_grafana.py).
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing ${need[*]}; run as root (or install them) to run every test" >&2
  exit 0
fi
echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
