"""Worker programs (``python -c`` source) shared by the host tests and the VM's guest checks."""

from __future__ import annotations

# A process of the group outside the supervisor's tree: it says its PID, waits for GO, then
# allocates far past the group's limit, first in line for the OOM killer.
OUTSIDER = (
    "import os, sys, time\n"
    "open('/proc/self/oom_score_adj', 'w').write('1000')\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "while not os.path.exists(sys.argv[2]): time.sleep(0.01)\n"
    "chunks = []\n"
    "while True:  # 16 MiB at a time until the OOM killer ends it\n"
    "    c = bytearray(16 << 20); c[::4096] = b'x' * (len(c) // 4096); chunks.append(c)\n"
)
# The worker: says GO, waits until the outsider is dead, then is killed -9 (as by an operator).
KILLED_9 = (
    "import os, signal, sys, time\n"
    "open(sys.argv[1], 'w').write('1')\n"
    "pid = sys.argv[2]\n"
    "def alive():\n"
    "    try: return open('/proc/%s/stat' % pid).read().rsplit(')', 1)[1].split()[0] != 'Z'\n"
    "    except (FileNotFoundError, ProcessLookupError): return False\n"
    "while alive(): time.sleep(0.01)\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)
# The stand-in for CUDA's pinned host memory: cudaHostAlloc pages are charged to the memory cgroup
# as shmem (MakazhanAlpamys/Soup#655), which memfd_create(2) pages are too (mm/shmem.c backs a
# memfd). It holds argv[1] MiB of memfd pages, all touched, writes "pinned" to argv[2], then grows
# by 8 MiB of private memory every 50 ms up to argv[3] MiB (0: no growth); on SIGTERM it appends
# how many MiB it had grown ("TERM <MiB>") and exits 0. With argv[4], it runs that command (split
# on blanks) while holding the pages and exits with its status.
PINNER = (
    "import mmap, os, signal, subprocess, sys, time\n"
    "MiB = 1 << 20\n"
    "n, marker, upto = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])\n"
    "fd = os.memfd_create('pinned-standin')\n"
    "os.ftruncate(fd, n * MiB)\n"
    "pinned = mmap.mmap(fd, n * MiB)\n"
    "for i in range(0, n * MiB, 4096): pinned[i] = 1\n"
    "open(marker, 'w').write('pinned\\n')\n"
    "if len(sys.argv) > 4: sys.exit(subprocess.run(sys.argv[4].split()).returncode)\n"
    "chunks = []\n"
    "def term(*a):\n"
    "    open(marker, 'a').write('TERM %d\\n' % (8 * len(chunks))); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "while 8 * len(chunks) < upto:\n"
    "    c = bytearray(8 * MiB); c[::4096] = b'x' * len(range(0, len(c), 4096)); chunks.append(c)\n"
    "    time.sleep(0.05)\n"
    "while True: time.sleep(1)\n"
)
# A neighbour in the worker's group: it holds argv[1] MiB of touched private memory, writes its PID to
# argv[2], then sleeps until killed.
HOLDER = (
    "import os, sys, time\n"
    "b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * (len(b) // 4096)\n"
    "open(sys.argv[2], 'w').write(str(os.getpid()))\n"
    "time.sleep(600)\n"
)
# A worker whose first start writes its PID to argv[1], waits until argv[2] exists, then does argv[3]:
# "sleep" (until killed, e.g. kill -9 from outside), "grow" (8 MiB every 50 ms, until stopped) or "hog"
# (16 MiB at a time until the OOM killer ends it, first in its line: oom_score_adj 1000). Every later
# start (argv[1] exists) exits 0 at once.
FIRST_RUN = (
    "import os, sys, time\n"
    "pidfile, go, then = sys.argv[1:4]\n"
    "if os.path.exists(pidfile): sys.exit(0)\n"
    "if then == 'hog': open('/proc/self/oom_score_adj', 'w').write('1000')\n"
    "open(pidfile, 'w').write(str(os.getpid()))\n"
    "while not os.path.exists(go): time.sleep(0.01)\n"
    "chunks, step, pause = [], (16 if then == 'hog' else 8) << 20, 0.05 if then == 'grow' else 0\n"
    "while then in ('grow', 'hog'):\n"
    "    c = bytearray(step); c[::4096] = b'x' * (len(c) // 4096); chunks.append(c); time.sleep(pause)\n"
    "time.sleep(600)\n"
)
# A worker whose graceful stop costs memory (a checkpoint written, buffers flushed): it grows by
# 8 MiB every 10 ms (800 MiB/s) until SIGTERM, then allocates 30 % more than it holds, writes the
# MiB it grew by to argv[1] and exits 0 (``run --grace-bytes``: tests/integration/test_guard.py, and on v2
# tests/integration/vm/guest/check_guard.py).
GRACEFUL = (
    "import signal, sys, time\n"
    "chunks, asked = [], []\n"
    "signal.signal(signal.SIGTERM, lambda *a: asked.append(1))\n"
    "def grow():\n"
    "    c = bytearray(8 << 20); c[::4096] = b'x' * len(range(0, len(c), 4096)); chunks.append(c)\n"
    "while not asked:\n"
    "    grow(); time.sleep(0.01)\n"
    "extra = (len(chunks) * 3 + 9) // 10\n"
    "for _ in range(extra):\n"
    "    grow(); time.sleep(0.002)\n"
    "open(sys.argv[1], 'w').write(str(extra * 8))\n"
)
