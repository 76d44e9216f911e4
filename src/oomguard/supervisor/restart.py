"""Restart decisions for ``oomguard run``: pure logic over a clock, so tests use a fake one.

- ``--restart on-failure`` (default): restart after anything but a clean exit; ``always``;
  ``never``. Never after an operator's stop.
- Backoff: initial x factor^(n-1) for the n-th consecutive restart, capped at ``backoff_max``;
  the count resets when the child ran at least ``healthy_after`` seconds.
- ``max_restarts`` within ``window`` seconds: one more and the supervisor gives up.
"""

from __future__ import annotations

from collections import deque

from oomguard.errors import BadParameter

RESTART_MODES = ("on-failure", "always", "never")


class RestartPolicy:
    def __init__(
        self,
        mode: str = "on-failure",
        *,
        backoff_initial: float = 1.0,
        backoff_max: float = 300.0,
        backoff_factor: float = 2.0,
        healthy_after: float = 600.0,
        max_restarts: int | None = None,
        window: float = 600.0,
    ) -> None:
        if mode not in RESTART_MODES:
            raise BadParameter("mode", f"expected one of {', '.join(RESTART_MODES)}, got {mode!r}")
        if backoff_factor < 1:
            raise BadParameter("backoff_factor", f"must be at least 1, got {backoff_factor}")
        self.mode = mode
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.backoff_factor = backoff_factor
        self.healthy_after = healthy_after
        self.max_restarts = max_restarts
        self.window = window
        self.consecutive = 0  # restarts since the child last ran healthy
        self._restarts: deque[float] = deque()  # times of recent restarts

    def wants_restart(self, reason: str, operator_stop: bool) -> bool:
        """Whether the mode asks for a restart after an exit of *reason* ("clean", "exit", ...)."""
        if operator_stop or self.mode == "never":
            return False
        return self.mode == "always" or reason != "clean"

    def gives_up(self, now: float) -> bool:
        """True when one more restart would exceed max_restarts within the window."""
        while self._restarts and now - self._restarts[0] > self.window:
            self._restarts.popleft()
        return self.max_restarts is not None and len(self._restarts) >= self.max_restarts

    def next_delay(self, uptime: float, now: float) -> float:
        """Record a restart at *now* after a run of *uptime* seconds; return the delay before it."""
        if uptime >= self.healthy_after:
            self.consecutive = 0
        self.consecutive += 1
        self._restarts.append(now)
        try:
            delay = self.backoff_initial * self.backoff_factor ** (self.consecutive - 1)
        except OverflowError:
            delay = self.backoff_max
        return float(min(delay, self.backoff_max))
