"""Cross-process wake-ups on Postgres: one NOTIFY per burst of commits, sent after they commit.

Listeners in other processes sleep until a NOTIFY tells them the log grew, then read it. A NOTIFY
inside every append costs each commit about a twelfth of its latency (the server queues the
notification under a global lock at commit; ``bench store`` shows the difference). Instead the
appender pokes this notifier after each commit: the first poke of a quiet period arms it, and one
NOTIFY follows a short window later on the notifier's own connection, covering every commit of the
window. Listeners learn of a commit at most a window plus a round trip late; their polling
fallback covers a notifier that failed or a process that died before sending. In-process waiters
never depend on this: the store wakes them directly.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import structlog

__all__ = ["DEFAULT_WINDOW_SECONDS", "Notifier"]

log = structlog.get_logger("eventstore.wakeups")

DEFAULT_WINDOW_SECONDS = 0.001


class Notifier:
    """Sends ``NOTIFY channel`` at most once per window, on its own connection and thread."""

    def __init__(
        self, conninfo: str, channel: str, *, window: float = DEFAULT_WINDOW_SECONDS
    ) -> None:
        self._conninfo = conninfo
        self._statement = f"SELECT pg_notify('{channel}', '')"
        self._window = window
        self._changed = threading.Condition()
        self._armed = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._connection: psycopg.Connection[Any] | None = None

    def poke(self) -> None:
        """Note that something committed; a NOTIFY will follow within the window."""
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
                    self._changed.wait()
                if not self._armed:
                    break
                if not self._closing:
                    # Let the rest of the burst commit; a close cuts the wait short.
                    self._changed.wait(self._window)
                self._armed = False
                closing = self._closing
            self._send()
            if closing:
                break
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _send(self) -> None:
        try:
            if self._connection is None or self._connection.closed:
                self._connection = psycopg.connect(self._conninfo, autocommit=True)
            self._connection.execute(self._statement, prepare=True)
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
