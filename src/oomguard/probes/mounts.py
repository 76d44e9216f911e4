"""Parsers for ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` (text in, values out).

mountinfo (proc(5)), one mount per line::

    36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    (1)(2) (3)  (4)     (5)         (6)      (7)    (8)  (9)    (10)      (11)

(7) is zero or more optional fields, ended by the single ``-`` of (8). Root (4) and
mount point (5) escape space, tab, newline and backslash as ``\\040 \\011 \\012 \\134``.
Super options (11) may contain spaces (9p mounts of Docker Desktop and WSL), so
everything after the source is kept as one string.

/proc/self/cgroup (cgroups(7)), one hierarchy per line::

    12:memory:/docker/<id>          (v1: id, controllers, path)
    0::/system.slice/foo.scope      (v2: id 0, no controllers)

Kubernetes paths contain colons (``...slice:cri-containerd:<id>``), so a line is
split on its first two colons only.

Both files are split into lines on ``\\n`` only, never with ``str.splitlines()``, which also
breaks at ``\\r \\v \\f \\x1c-\\x1e \\x85 U+2028 U+2029``. A cgroup name may hold any byte but
``/`` and NUL, except ``\\n``: kernel/cgroup/cgroup.c ``cgroup_mkdir()`` (and, since commit
b7e24eb1caa5, ``cgroup1_rename()``) refuse it "to prevent making /proc/<pid>/cgroup
unparsable". In mountinfo the kernel escapes only space, tab, newline and backslash
(proc(5); ``show_mountinfo()`` and ``cgroup_show_path()`` pass ``" \\t\\n\\\\"`` to the escaper).
A NUL byte is never in either file: a line holding one is malformed.
"""

from __future__ import annotations


class Mount:
    __slots__ = ("fstype", "mount_point", "root", "source", "super_options")

    def __init__(self, root: str, mount_point: str, fstype: str, source: str, super_options: str) -> None:
        self.root = root
        self.mount_point = mount_point
        self.fstype = fstype
        self.source = source
        self.super_options = super_options

    def options(self) -> list[str]:
        return self.super_options.split(",")

    def __repr__(self) -> str:
        return f"Mount({self.root!r}, {self.mount_point!r}, {self.fstype!r}, {self.super_options!r})"


class CgroupEntry:
    __slots__ = ("controllers", "hierarchy_id", "path")

    def __init__(self, hierarchy_id: str, controllers: list[str], path: str) -> None:
        self.hierarchy_id = hierarchy_id
        self.controllers = controllers
        self.path = path

    def __repr__(self) -> str:
        return f"CgroupEntry({self.hierarchy_id!r}, {self.controllers!r}, {self.path!r})"


def unescape_octal(s: str) -> str:
    """Undo the kernel's ``\\ooo`` escaping (``\\040`` is a space)."""
    if "\\" not in s:
        return s
    out: list[str] = []
    i = 0
    n = len(s)
    while i < n:
        c = s[i]
        digits = s[i + 1 : i + 4]
        if c == "\\" and len(digits) == 3 and all(d in "01234567" for d in digits):
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_mountinfo_line(line: str) -> Mount | None:
    """One mountinfo line, or None when it does not have the documented shape."""
    fields = line.split(" ")
    try:
        sep = fields.index("-", 6)
    except ValueError:
        return None
    if len(fields) < sep + 3:
        return None
    super_options = " ".join(fields[sep + 3 :])
    return Mount(
        unescape_octal(fields[3]),
        unescape_octal(fields[4]),
        fields[sep + 1],
        unescape_octal(fields[sep + 2]),
        super_options,
    )


def parse_mountinfo(text: str) -> tuple[list[Mount], int]:
    """All parseable mounts, and how many non-empty lines could not be parsed."""
    mounts: list[Mount] = []
    bad = 0
    for line in text.split("\n"):
        if not line.strip():
            continue
        m = parse_mountinfo_line(line) if "\0" not in line else None
        if m is None:
            bad += 1
        else:
            mounts.append(m)
    return mounts, bad


def parse_proc_cgroup(text: str) -> tuple[list[CgroupEntry], int]:
    """All ``id:controllers:path`` entries, and how many lines were malformed."""
    entries: list[CgroupEntry] = []
    bad = 0
    for line in text.split("\n"):
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/") or "\0" in line:
            bad += 1
            continue
        controllers = [c for c in parts[1].split(",") if c]
        entries.append(CgroupEntry(parts[0], controllers, parts[2]))
    return entries, bad


def mount_for(mounts: list[Mount], path: str) -> Mount | None:
    """The mount whose mount point is *path* (the last one wins, as in the kernel)."""
    found = None
    for m in mounts:
        if m.mount_point == path:
            found = m
    return found
