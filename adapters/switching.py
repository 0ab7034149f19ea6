"""Shorter turns between threads holding the interpreter, for answers that wait on a thread.

A listener's event loop is busy parsing and answering while the threads it hands work to (the
log's committer, its reader, a leader's duties) wait for the interpreter: CPython lets a running
thread keep it for its switch interval, 5 ms by default, before another gets a turn. An answer
that waits for a commit pays that wait on each hand-off, twice or more per request; measured
beside a busy loop, a database round trip had a p99 of 10-29 ms at 5 ms and 4.5-5.5 ms at
0.5 ms. 1 ms keeps most of that gain for a small cost in switching overhead.
"""

from __future__ import annotations

import sys

__all__ = ["ShortThreadSwitches"]

SWITCH_INTERVAL_SECONDS = 0.001


class ShortThreadSwitches:
    """A lifecycle member: shortens the interpreter's switch interval while it runs."""

    __slots__ = ("_interval",)

    def __init__(self) -> None:
        self._interval = sys.getswitchinterval()

    def start(self) -> None:
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._interval, SWITCH_INTERVAL_SECONDS))

    def stop(self) -> None:
        sys.setswitchinterval(self._interval)
