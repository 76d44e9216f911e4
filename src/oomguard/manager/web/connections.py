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
- Room for the requests that matter (issue 37, item 4: 17 loopback addresses reconnecting, without
  a token, left /healthz answering 11 of 80 probes). When every place is taken, a new connection
  takes the place of one that is not serving a protected request (``Slot.protected``: /healthz, or
  a valid token or session: ``web.priority``), of the client that holds the most, provided that
  client holds at least two more than the newcomer's: its oldest such connection is shut down at
  once, whether long held or accepted a moment ago (a flood that reconnects all at once refills
  every place in one batch of accepts, before any of them has a protocol). So a flood from a few
  dozen addresses, held open or reconnecting, cannot keep out a probe or an agent that holds one
  connection; a flood of that many addresses each holding one connection is no longer one
  client's doing, and the cap holds as before. A trusted proxy's connections are never evicted
  (it carries many clients); its new ones may evict.
"""

from __future__ import annotations

import contextlib
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


class Slot:
    """One admitted connection's place. Calling it releases the place (once; later calls do
    nothing). Evictable while it serves no protected request (``Admission.protect``); evicting it
    shuts its socket down (``shutdown(2)``: the peer sees the end, the event loop reads it and
    closes the connection, whether or not its protocol exists yet)."""

    __slots__ = ("_admission", "done", "key", "protected", "sock")

    def __init__(self, admission: Admission, key: str | None) -> None:
        self._admission = admission
        self.key = key  # None: a trusted proxy's
        self.sock: weakref.ref[socket.socket] | None = None
        self.protected = False
        self.done = False

    @property
    def evictable(self) -> bool:
        return self.key is not None and not self.protected and not self.done

    def evict(self) -> None:
        sock = self.sock() if self.sock is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):  # gone already
                sock.shutdown(socket.SHUT_RDWR)

    def __call__(self) -> None:
        self._admission.release(self)


class Admission:
    """Connections held per client and in all; ``admit`` says yes (the ``Slot``: call it once the
    connection is gone) or no, evicting an unprotected connection of the heaviest client when
    every place is taken (module docstring). Thread-safe: a garbage-collected socket may release
    anywhere; the rest runs on the event loop."""

    def __init__(self, per_client: int, accept_cap: int, trusted: Sequence[Network] = ()) -> None:
        self.per_client = per_client
        self.accept_cap = accept_cap
        self.trusted = tuple(trusted)
        self.total = 0
        self.refused = 0
        self.evicted = 0
        self._held: dict[str, int] = {}
        self._slots: dict[str, dict[Slot, None]] = {}  # client -> its slots, oldest first
        self._evictable: dict[str, int] = {}  # client -> how many of its slots are evictable
        self._by_fd: dict[int, Slot] = {}
        self._lock = threading.Lock()

    def held(self, host: str) -> int:
        with self._lock:
            return self._held.get(client_key(host), 0)

    def admit(self, host: str) -> Slot | None:
        key = None if is_trusted(host, self.trusted) else client_key(host)
        victim: Slot | None = None
        with self._lock:
            mine = 0 if key is None else self._held.get(key, 0)
            if key is not None and mine >= self.per_client:
                self.refused += 1
                return None
            if self.total >= self.accept_cap:
                victim = self._victim(mine)
                if victim is None:
                    self.refused += 1
                    return None
                self._release(victim)
                self.evicted += 1
            slot = Slot(self, key)
            self.total += 1
            if key is not None:
                self._held[key] = mine + 1
                self._slots.setdefault(key, {})[slot] = None
                self._evictable[key] = self._evictable.get(key, 0) + 1
        if victim is not None:
            victim.evict()
        return slot

    def _victim(self, mine: int) -> Slot | None:
        """The oldest evictable slot of the client holding the most (at least ``mine + 2``), or None."""
        best, most = None, mine + 1
        for key, count in self._evictable.items():
            if count and self._held[key] > most:
                best, most = key, self._held[key]
        if best is None:
            return None
        return next(s for s in self._slots[best] if s.evictable)

    def bind(self, slot: Slot, sock: socket.socket) -> None:
        """*slot* is the connection *sock* (its protocol finds it by its descriptor: ``slot_of``)."""
        with self._lock:
            if not slot.done:
                slot.sock = weakref.ref(sock)
                self._by_fd[sock.fileno()] = slot

    def slot_of(self, fd: int) -> Slot | None:
        """The place of the connection of descriptor *fd* (None: none of ours, or released)."""
        with self._lock:
            slot = self._by_fd.get(fd)
            return None if slot is None or slot.done else slot

    def protect(self, slot: Slot, protected: bool) -> None:
        """*slot* serves a protected request (not evictable) or no longer does."""
        with self._lock:
            if slot.done or slot.protected == protected:
                return
            before = slot.evictable
            slot.protected = protected
            self._count_evictable(slot, before)

    def _count_evictable(self, slot: Slot, before: bool) -> None:
        if slot.key is None or slot.evictable == before:
            return
        left = self._evictable.get(slot.key, 0) + (1 if slot.evictable else -1)
        if left:
            self._evictable[slot.key] = left
        else:
            self._evictable.pop(slot.key, None)

    def release(self, slot: Slot) -> None:
        with self._lock:
            self._release(slot)
            sock = slot.sock() if slot.sock is not None else None
            if sock is not None and self._by_fd.get(sock.fileno()) is slot:
                del self._by_fd[sock.fileno()]

    def _release(self, slot: Slot) -> None:
        if slot.done:
            return
        before = slot.evictable
        slot.done = True
        self._count_evictable(slot, before)
        self.total -= 1
        key = slot.key
        if key is not None:
            left = self._held[key] - 1
            del self._slots[key][slot]
            if left:
                self._held[key] = left
            else:
                del self._held[key]
                del self._slots[key]


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
            slot = self.admission.admit(str(addr[0]))
            if slot is None:
                os.close(fd)
                continue
            conn = CountedSocket(self.family, self.type, self.proto, fileno=fd)
            conn._release = slot
            self.admission.bind(slot, conn)
            weakref.finalize(conn, slot)
            return conn, addr
        raise BlockingIOError(errno.EAGAIN, "refused connections closed; more on the next turn")
