"""Who may hold a connection: a limit per client and one for everybody, decided when the kernel
hands a connection over (accept(2)), before asyncio makes a transport of it.

- A client is its peer address: an IPv4 address, or the /64 an IPv6 address is in (one host's
  usual share: RFC 4291, section 2.5.4, and RFC 6177 give a site a /48 to /64, so a client that
  rotates through its own /64 is still one client). An IPv4-mapped IPv6 peer is its IPv4 address.
- A trusted proxy (``--trusted-proxy``) is not limited per client: it carries many clients, and at
  accept time no request, so no forwarded address, is known yet. The global cap still holds; the
  proxy limits its own clients (deploy/proxy/nginx.conf: ``limit_conn``).
- Over its client's limit, or over the global accept cap, a connection is closed at once: no
  descriptor stays held for it and nothing of it reaches the event loop. Counting at accept, not
  in the protocol, matters: asyncio accepts up to ``backlog`` connections in one turn before any
  protocol sees one (``BaseSelectorEventLoop._accept_connection``), so a count kept by protocols
  lags by a whole batch (uvicorn's backlog is 2048: more than a 1,024 descriptor limit).
- A connection is counted until its socket is closed (``CountedSocket._real_close``, what
  ``socket.close()`` calls once the last reference is gone; the Python docs, socket.close), or
  garbage collected without a close (a ``weakref.finalize`` as a safety net): the count is of
  descriptors actually held.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from oomguard.manager.web.proxies import Network, address, is_trusted

OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
REFUSE_BATCH = 256  # refused connections closed in one accept() call before the event loop runs again
IPV6_CLIENT_PREFIX = 64
SAME_TURN_S = 0.5  # accept() calls this close after an EMFILE belong to the same turn (asyncio retries after 1 s)


def client_key(host: str) -> str:
    """The client a peer address belongs to: the IPv4 address, the IPv6 /64, or the text itself."""
    ip = address(host.split("%", 1)[0])  # a link-local peer carries its zone: fe80::1%eth0
    if ip is None:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, IPV6_CLIENT_PREFIX), strict=False))
    return str(ip)


class Admission:
    """Connections held per client and in all; ``admit`` says yes (with the release to call once
    the connection is gone) or no. Thread-safe: a garbage-collected socket may release anywhere."""

    def __init__(self, per_client: int, accept_cap: int, trusted: Sequence[Network] = ()) -> None:
        self.per_client = per_client
        self.accept_cap = accept_cap
        self.trusted = tuple(trusted)
        self.total = 0
        self.refused = 0
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def held(self, host: str) -> int:
        with self._lock:
            return self._held.get(client_key(host), 0)

    def admit(self, host: str) -> Callable[[], None] | None:
        key = None if is_trusted(host, self.trusted) else client_key(host)
        with self._lock:
            if self.total >= self.accept_cap or (key is not None and self._held.get(key, 0) >= self.per_client):
                self.refused += 1
                return None
            self.total += 1
            if key is not None:
                self._held[key] = self._held.get(key, 0) + 1
        done = False

        def release() -> None:
            nonlocal done
            with self._lock:
                if done:
                    return
                done = True
                self.total -= 1
                if key is not None:
                    left = self._held[key] - 1
                    if left:
                        self._held[key] = left
                    else:
                        del self._held[key]

        return release


class CountedSocket(socket.socket):
    """An accepted connection that gives its place back when it is closed."""

    __slots__ = ("_release",)
    _release: Callable[[], None] | None

    def _real_close(self, *args: Any) -> None:
        release = getattr(self, "_release", None)
        self._release = None
        if release is not None:
            release()
        super()._real_close(*args)  # type: ignore[misc]


class GuardedListener(socket.socket):
    """The listening socket: ``accept()`` hands over only the connections ``admission`` lets in and
    closes the others at once. After ``REFUSE_BATCH`` refusals in one call it says "nothing more
    now" (BlockingIOError, what a drained non-blocking accept raises), so a flood of refused
    connections cannot keep the event loop from serving the admitted ones; the listening socket
    is still readable, so asyncio calls again on its next turn.

    Out of descriptors (EMFILE and the like), the first call raises it and the others of the same
    turn say "nothing more now": Python 3.11's ``_accept_connection`` goes on calling accept()
    after reporting the error (up to ``backlog`` times, each report a log line and a retry);
    the first report already stopped reading the socket for a second."""

    __slots__ = ("_failed_at", "admission")
    admission: Admission
    _failed_at: float

    @classmethod
    def wrap(cls, sock: socket.socket, admission: Admission) -> GuardedListener:
        """*sock* as a guarded listener: its descriptor moves over (*sock* is detached)."""
        listener = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        listener.admission = admission
        listener._failed_at = -SAME_TURN_S
        return listener

    def accept(self) -> tuple[socket.socket, Any]:
        for _ in range(REFUSE_BATCH):
            try:
                fd, addr = self._accept()  # type: ignore[attr-defined]
            except OSError as exc:
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    raise
                now = time.monotonic()
                if now - self._failed_at < SAME_TURN_S:
                    raise BlockingIOError(errno.EAGAIN, "out of descriptors: reported already") from None
                self._failed_at = now
                raise
            release = self.admission.admit(str(addr[0]))
            if release is None:
                os.close(fd)
                continue
            conn = CountedSocket(self.family, self.type, self.proto, fileno=fd)
            conn._release = release
            weakref.finalize(conn, release)
            return conn, addr
        raise BlockingIOError(errno.EAGAIN, "refused connections closed; more on the next turn")
