"""The HTTP protocol the manager serves with: uvicorn's h11 protocol with a deadline for every
phase of a connection, whatever the method, a GET, HEAD or OPTIONS body refused before any app
code runs, and the requests that matter (``web.priority``: /healthz, a valid token or session)
served above the 503 cap and never evicted while they are (``connections.Admission``).
``web.server`` sets it up (``guarded_protocol``) and documents the rules."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.protocols.http.h11_impl import H11Protocol

from oomguard.manager.web.connections import Admission, Slot
from oomguard.manager.web.middleware import BODYLESS, announces_body
from oomguard.manager.web.priority import HEALTH, Classifier

OVERLOAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 30.0  # Settings.body_timeout_s's default
BODY_GRACE_S = 1.0  # the protocol's body deadline is this after BodyLimit's
_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_NO_BODY = (
    b'{"detail":"a %s request may not carry a body"}',
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nx-content-type-options: nosniff\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n",
)


class BodylessGuard(h11.Connection):
    """h11's server side that stops at a GET, HEAD or OPTIONS request announcing a body: it calls
    *refuse* (which answers 400 and closes) and reports PAUSED, so uvicorn creates no task for it
    and reads nothing more (``H11Protocol.handle_events`` stops at PAUSED). Every other request's
    head goes to *seen* first, before uvicorn decides on it."""

    def __init__(self, max_incomplete_event_size: int, refuse: Any, seen: Any = None) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size)
        self._refuse = refuse
        self._seen = seen

    def next_event(self) -> Any:
        event = super().next_event()
        if not isinstance(event, h11.Request):
            return event
        if event.method.decode("ascii", "replace") in BODYLESS and announces_body(list(event.headers)):
            self._refuse(event.method)
            return h11.PAUSED
        if self._seen is not None:
            self._seen(event)
        return event


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each phase of a connection: ``headers`` (from the
    connection or the request's first byte, not renewed by each byte), ``body`` (from the end of
    the headers, whatever the method and whether an answer went out already) and ``idle`` (between
    requests, when uvicorn's own keep-alive timer is not running: a byte of an unread body cancels
    it). While the app works on a request there is none (its own time-outs hold). A GET, HEAD or
    OPTIONS request that announces a body gets 400 and the connection is closed before any app
    code runs (``BodylessGuard``; the app's ``BodyLimit`` says the same where no server of ours
    runs it)."""

    header_timeout_s = 10.0
    body_timeout_s = BODY_TIMEOUT_S
    admission: Admission | None = None  # the server's (``connections``): this connection's place
    protects: Classifier | None = None  # which requests are protected (``priority``); None: /healthz only

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._phase: str | None = None
        self._slot: Slot | None = None
        self._cap = self.limit_concurrency  # the 503 cap; a protected request is served above it
        size = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        self.conn = BodylessGuard(size, self._refuse_body, self._request)

    def _request(self, event: h11.Request) -> None:
        """A request's head is in: protected or not (``priority``), before uvicorn looks at the
        503 cap (``limit_concurrency``, read right after this)."""
        rule = self.protects
        if rule is None:
            protected = event.target.split(b"?", 1)[0] == HEALTH
        else:
            protected = rule(event.method, event.target, list(event.headers))
        self.limit_concurrency = None if protected else self._cap
        if self._slot is not None and self.admission is not None:
            self.admission.protect(self._slot, protected)

    def _refuse_body(self, method: bytes) -> None:
        body = _NO_BODY[0] % method
        self.transport.write(_NO_BODY[1] % len(body) + (b"" if method == b"HEAD" else body))
        self.transport.close()

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if self.admission is not None and sock is not None:
            self._slot = self.admission.slot_of(sock.fileno())
        self._enter("headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        if self._slot is not None and self.admission is not None:
            self.admission.protect(self._slot, False)  # before a pipelined next request is read
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._enter(None)
        super().connection_lost(exc)

    def _follow(self) -> None:
        """The phase the connection is in now, from h11's view of the client's side."""
        state = self.conn.their_state
        phase: str | None = None
        if self.transport.is_closing():
            phase = None
        elif state is h11.IDLE:
            if self.conn.trailing_data[0]:
                phase = "headers"  # part of the next request came
            elif self.timeout_keep_alive_task is None:
                phase = "idle"
        elif state is h11.SEND_BODY:
            phase = "body"
        self._enter(phase)

    def _enter(self, phase: str | None) -> None:
        if phase == self._phase:
            return  # not renewed: a deadline runs from the start of its phase
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = phase
        if phase is not None:
            self._timer = self.loop.call_later(self._timeout(phase), self._expired)

    def _timeout(self, phase: str) -> float:
        if phase == "body":
            return self.body_timeout_s + BODY_GRACE_S
        if phase == "idle":
            return float(self.timeout_keep_alive)
        limit = self._cap
        return OVERLOAD_TIMEOUT_S if limit is not None and len(self.connections) > limit else self.header_timeout_s

    def _expired(self) -> None:
        phase, self._timer, self._phase = self._phase, None, None
        if self.transport.is_closing():
            return
        if phase == "headers" and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self.transport.write(_408)  # part of a request came: say why it is closed
        elif phase == "body" and (self.cycle is None or not self.cycle.response_started):
            self.transport.write(_408)
        self.transport.close()


def guarded_protocol(
    header_timeout_s: float,
    body_timeout_s: float = BODY_TIMEOUT_S,
    admission: Admission | None = None,
    protects: Classifier | None = None,
) -> type[GuardedH11Protocol]:
    attrs = {
        "header_timeout_s": header_timeout_s,
        "body_timeout_s": body_timeout_s,
        "admission": admission,
        "protects": staticmethod(protects) if protects is not None else None,
    }
    return type("GuardedH11", (GuardedH11Protocol,), attrs)
