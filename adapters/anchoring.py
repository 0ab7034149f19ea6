"""The leader anchors the log's head into a file, periodically and when it stops.

An anchor (eventstore/anchors.py) is the head's position and hash, signed with a key the
database does not hold: kept outside the database, it lets ``fleetledger audit verify --anchor``
catch a deleted tail and rewrites with recomputed hashes, which the hash chain alone cannot. It
covers the log only up to its position, so a long-running controller writes one every
``every_seconds``, once when elected and once when it stops.

Only the leader writes: the controllers of one database share the anchor file, and one writer at
a time (a lock on the file's directory besides) appends to its chain. A new anchor never buries
evidence: it is appended only after the log was found to hold the newest anchor's head unchanged
and the hash chain from there verified, and it signs the last position verified. When the log no
longer matches, or the file no longer holds the last anchor this process wrote or checked (it was
rolled back to an older copy, or replaced), nothing is written (the file is what shows the
tampering), the refusal is logged as an error at every period, and ``fleetledger audit verify
--anchor`` tells the rest. Each anchor's digest is logged: kept elsewhere, it lets ``audit verify
--expect-anchor`` catch a rollback of the file after this process has gone.

Errors::

    AnchorError (eventstore.anchors: key or file unusable; a ValueError)
    └── AnchorRefused (eventstore.anchors)
        └── AnchoringRefused  the log no longer matches the chain in the file, or that file was
                              rolled back, replaced or altered since the start: nothing written
"""

from __future__ import annotations

import math
import os
import threading
from datetime import datetime, timedelta
from pathlib import Path

import structlog

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.runtime.duties import Duties
from fleetledger.adapters.runtime.leadership import Leadership
from fleetledger.eventstore import EventStore, EventStoreError
from fleetledger.eventstore.anchors import (
    Anchor,
    AnchorError,
    AnchorRefused,
    Signer,
    read_anchor,
    record_anchor,
    signed_by,
    verifier_for,
)

__all__ = [
    "DEFAULT_ANCHOR_EVERY_SECONDS",
    "MAX_ANCHOR_EVERY_SECONDS",
    "AnchorRecorder",
    "AnchoringRefused",
    "checked_anchor_period",
]

DEFAULT_ANCHOR_EVERY_SECONDS = 300.0
MAX_ANCHOR_EVERY_SECONDS = 365 * 24 * 3600.0

log = structlog.get_logger(__name__)


class AnchoringRefused(AnchorRefused):
    """The log no longer holds the head anchored in the file, its chain from there does not
    verify, or the file no longer holds the chain this key signed up to the last anchor this
    process saw: the file is kept as the evidence and no anchor is written."""


def checked_anchor_period(seconds: float) -> float:
    """``seconds`` if it is a usable anchor period, else ValueError saying what is."""
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_ANCHOR_EVERY_SECONDS):
        raise ValueError(
            f"the anchor period must be more than 0 and at most {MAX_ANCHOR_EVERY_SECONDS:.0f} s "
            f"(a year), not {seconds}"
        )
    return seconds


class AnchorRecorder:
    """Writes signed anchors of the log's head into ``path`` while this process leads.

    With ``threads`` a background thread anchors every ``every_seconds`` of ``clock`` time (and
    at once when elected); without, the caller drives it with :meth:`tick` or
    :meth:`record_now`. Without ``leadership`` the recorder leads from start to stop (one
    process); with one, it shares the process's leadership and never starts or stops it.
    """

    def __init__(
        self,
        store: EventStore,
        signer: Signer,
        path: Path,
        *,
        clock: Clock,
        every_seconds: float = DEFAULT_ANCHOR_EVERY_SECONDS,
        leadership: Leadership | None = None,
        threads: bool = True,
    ) -> None:
        """Raises ValueError (AnchorError for the file) when the configuration cannot work: a
        non-positive period, a directory that is missing or not writable, or a file already
        there that is not an anchor this key verifies (say, from another key: move it aside to
        start a new series once ``fleetledger audit verify --anchor`` has looked at it)."""
        every_seconds = checked_anchor_period(every_seconds)
        directory = path.parent
        if not directory.is_dir() or not os.access(directory, os.W_OK | os.X_OK):
            raise ValueError(
                f"cannot write anchors into {str(directory)!r}: create it, or make it writable "
                "by this process"
            )
        self._store = store
        self._signer = signer
        self._verifier = verifier_for(signer)
        self.path = path
        self._clock = clock
        self._every = timedelta(seconds=every_seconds)
        self._threads = threads
        self._known = self._chain_in_file()
        # Writing holds one lock (a verification may take a while); the schedule another, so
        # that the leadership's callbacks, which must return at once, never wait for a write.
        self._writing = threading.Lock()
        self._schedule = threading.Lock()
        self._due: datetime | None = None  # None: at the next chance
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.last: Anchor | None = None
        """The last anchor this recorder wrote (or found written further by another)."""
        self.duties = Duties(
            leadership, on_lead=self._lead, on_follow=self._follow, manage_leadership=False
        )

    @property
    def leading(self) -> bool:
        return self.duties.leading

    def start(self) -> AnchorRecorder:
        """Anchor while this process leads: at once if it leads already, else once elected."""
        self._stopping.clear()
        self.duties.start(threads=self._threads)
        if self._threads and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="anchoring", daemon=True)
            self._thread.start()
        log.info(
            "anchoring the log",
            path=str(self.path),
            every_seconds=self._every.total_seconds(),
            algorithm=self._signer.algorithm,
            newest_anchor=None if self._known is None else self._known.sequence,
            newest_digest=None if self._known is None else self._known.digest(),
        )
        return self

    def stop(self, *, timeout: float | None = 10.0) -> None:
        """Stop the periodic anchoring and, as the leader, anchor the head one last time."""
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        self._anchor_logging_failures("stop")
        self.duties.relinquish()

    def tick(self) -> Anchor | None:
        """Anchor if this process leads and the period has passed since the last anchor."""
        due = self._next_due()
        if due is not None and self._clock.now() < due:
            return None
        return self.record_now()

    def record_now(self) -> Anchor | None:
        """Anchor the head now if this process leads (``None`` if it follows).

        Raises AnchoringRefused when the log no longer matches the anchor already in the file,
        AnchorError when the file cannot be read or written, EventStoreError when the log
        cannot be read.
        """
        if not self.leading:
            return None
        with self._writing:
            # A leader deposed from here on writes this one anchor still: it is of the log as it
            # is (the log only grows), and the next leader's anchors follow it in the chain.
            try:
                anchor = record_anchor(
                    self._store, self._signer, self.path, at=self._clock.now(), known=self._known
                )
            except AnchorRefused as e:
                raise AnchoringRefused(str(e)) from e
            self.last = self._known = anchor
            with self._schedule:
                self._due = self._clock.now() + self._every
        log.info(
            "anchored the log",
            position=anchor.position,
            sequence=anchor.sequence,
            digest=anchor.digest(),
            path=str(self.path),
        )
        return anchor

    def _chain_in_file(self) -> Anchor | None:
        """The newest anchor in the file, checked to be genuine under this key (None without a
        file). The chain before it is ``audit verify``'s to check: reading it all at every start
        would cost a second per ten thousand anchors."""
        if not self.path.exists():
            return None
        newest = read_anchor(self.path)
        if newest.algorithm != self._verifier.algorithm or not signed_by(newest, self._verifier):
            raise AnchorError(
                f"the newest anchor in {str(self.path)!r} does not verify with this key (another "
                "key signed it, or it was altered); check it with `fleetledger audit verify "
                "--anchor`, then move it aside to start a new series"
            )
        return newest

    def _anchor_logging_failures(self, why: str) -> None:
        try:
            self.record_now()
        except AnchoringRefused as e:
            log.error(
                "the log no longer matches its anchor; run `fleetledger audit verify --anchor`",
                path=str(self.path),
                reason=str(e),
                when=why,
            )
        except (EventStoreError, OSError) as e:
            log.warning("could not anchor the log; trying again", error=str(e), when=why)
        except Exception:
            # The thread must outlive a surprise, and a stop must go on past one.
            log.exception("anchoring failed; trying again", when=why)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            due = self._next_due()
            if self.leading and (due is None or self._clock.now() >= due):
                self._anchor_logging_failures("period")
                with self._schedule:
                    if self._due is None or self._due <= self._clock.now():
                        # A failed attempt waits a period too, rather than spinning.
                        self._due = self._clock.now() + self._every
            self._wake.wait(self._seconds_to_wait())

    def _next_due(self) -> datetime | None:
        with self._schedule:
            return self._due

    def _seconds_to_wait(self) -> float:
        due = self._next_due()
        if due is None:
            return self._every.total_seconds()
        return max(0.0, min((due - self._clock.now()).total_seconds(), self._every.total_seconds()))

    def _lead(self, term: int | None) -> None:
        # An anchor as soon as this process leads, so the previous leader's last appends (those
        # made after its stop-time anchor) are covered without waiting a period.
        with self._schedule:
            self._due = None
        self._wake.set()

    def _follow(self, reason: str) -> None:
        log.info("not anchoring while following", reason=reason)
