"""Cross-process wake-ups on Postgres: NOTIFY after commits, at most once per window.

Listeners in other processes sleep until a NOTIFY tells them the log grew, then read it. A NOTIFY
inside every append costs each commit about a twelfth of its latency (the server queues the
notification under a global lock at commit; ``bench store`` shows the difference), and even one
sent separately per commit costs the client a thread wake-up and a round trip per append. Instead
the appender pokes this notifier after each commit, and the notifier throttles: a poke after a
quiet spell is sent at once (on the notifier's own connection and thread), then the notifier
holds off for a window; pokes meanwhile only arm it, and one NOTIFY at the window's end covers
them all. A lone commit therefore reaches listeners within a round trip, and a burst costs at
most one NOTIFY per window while listeners learn of each commit at most a window plus a round
trip late. Their polling fallback covers a notifier that failed or a process that died before
sending. In-process waiters never depend on this: the store wakes them directly.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import structlog

from fleetledger.eventstore._libpq import check_result

__all__ = ["DEFAULT_WINDOW_SECONDS", "Notifier"]

log = structlog.get_logger("eventstore.wakeups")

DEFAULT_WINDOW_SECONDS = 0.01
"""Bursts cost at most 100 NOTIFYs a second; a controller's loops run on a scale of seconds."""


class Notifier:
    """Sends ``NOTIFY channel, 'sender'`` after commits: at once after a quiet spell, then at
    most once per window while commits keep coming; on its own connection and thread."""

    def __init__(
        self,
        conninfo: str,
        channel: str,
        *,
        window: float = DEFAULT_WINDOW_SECONDS,
        sender: str = "",
    ) -> None:
        self._conninfo = conninfo
        quoted = channel.replace('"', '""')
        # The payload names the sending process, so that its own listener can tell its own
        # wake-ups (which it has already had in-process) from other processes'.
        payload = sender.replace("'", "''")
        self._statement = f"NOTIFY \"{quoted}\", '{payload}'".encode()
        self._window = window
        self._changed = threading.Condition()
        self._armed = False
        self._idle = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._connection: psycopg.Connection[Any] | None = None

    def poke(self) -> None:
        """Note that something committed; a NOTIFY follows at once, or at the latest when the
        current window ends."""
        # Unlocked fast path: during a burst the notifier is already armed. A poke that sees
        # it armed just as the notifier disarms is still covered: the notifier disarms before
        # it sends, and the poke's commit happened before the poke.
        if self._armed:
            return
        with self._changed:
            if self._closing:
                return
            self._armed = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="eventstore-notify", daemon=True
                )
                self._thread.start()
            elif self._idle:
                # Only an idle notifier is woken: one holding off ends its window by itself, and
                # waking it early on every burst would cost a thread switch per window for nothing.
                self._changed.notify()

    def close(self) -> None:
        """Send what is pending now, stop the thread and release the connection."""
        with self._changed:
            self._closing = True
            self._changed.notify()
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._changed:
            self._thread = None
            self._closing = False

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._armed and not self._closing:
                    self._idle = True
                    self._changed.wait()
                    self._idle = False
                if not self._armed:
                    break
                self._armed = False
                closing = self._closing
            self._send()
            if closing:
                break
            self._hold_off()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _hold_off(self) -> None:
        """Wait out the window after a send (a close cuts it short); pokes meanwhile just arm."""
        deadline = time.monotonic() + self._window
        with self._changed:
            while not self._closing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._changed.wait(remaining)

    def _send(self) -> None:
        try:
            if self._connection is None or self._connection.closed:
                self._connection = psycopg.connect(self._conninfo, autocommit=True)
            # Straight through libpq: the cursor's machinery would cost the client several times
            # what the statement does.
            pgconn = self._connection.pgconn
            check_result(pgconn, pgconn.exec_(self._statement))
        except psycopg.Error as e:
            # Listeners fall back to polling; the next burst tries a fresh connection.
            log.warning(
                "wake-up notification failed; listeners in other processes will notice new "
                "events by polling until it works again",
                error=str(e).strip(),
            )
            if self._connection is not None:
                self._connection.close()
                self._connection = None
