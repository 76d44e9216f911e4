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
    "    except FileNotFoundError: return False\n"
    "while alive(): time.sleep(0.01)\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)
