"""Reactors: side effects driven by the log, from checkpointed subscriptions, on the leader only.

A :class:`Reactor` names the events it reacts to (a codec, optionally a stream filter) and what
to do with each. :class:`Reactors` runs each one as a named subscription of the event store: the
checkpoint advances in the same transaction as the handler runs, so across restarts every event
is reacted to at least once — and exactly once in effect where the reaction is idempotent, which
every reaction must be (the log, not the reactor, holds the outcome of a side effect: a reaction
reads the state it acts on before acting).

Only the leader runs reactors (:meth:`Reactors.start` on election, :meth:`Reactors.stop` the
moment it is deposed); a reaction that takes long (a cloud call) should hand the work to a
:class:`~fleetledger.adapters.runtime.runners.TaskRunner` and return, so the checkpoint moves on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
import structlog

from fleetledger.domain.codec import registered_event_types
from fleetledger.eventstore import EventStore, RecordedEvent, Subscription
from fleetledger.projections.recent import RecentEvents

from .codec import EventCodec

__all__ = ["Reactor", "Reactors"]

log = structlog.get_logger(__name__)

E = TypeVar("E")


@dataclass(frozen=True, slots=True, kw_only=True)
class Reactor(Generic[E]):
    """Reacts to the events of ``codec`` (of the given ``types`` only, and in the streams
    ``streams`` accepts, when given) by calling ``react(event, record)``. ``name`` is the
    subscription's checkpoint name: keep it stable."""

    name: str
    codec: EventCodec[E]
    react: Callable[[E, RecordedEvent], None]
    types: tuple[type, ...] | None = None
    streams: Callable[[str], bool] | None = None

    def type_names(self) -> list[str]:
        names = self.codec.type_names()
        if self.types is None:
            return names
        wanted = set(self.types)
        known = registered_event_types()
        return [n for n in names if known[n].cls in wanted]

    def handle(
        self,
        record: RecordedEvent,
        connection: sa.Connection,
        *,
        recent: RecentEvents | None = None,
    ) -> None:
        """The subscription handler: decode and react (the connection is not needed). An
        event this process committed is taken from ``recent`` instead of decoded again."""
        if self.streams is not None and not self.streams(record.stream_id):
            return
        known = None if recent is None else recent.get(record)
        if isinstance(known, self.codec.event_types):
            event: E = known  # type: ignore[assignment]  # one of the codec's event types
        else:
            event = self.codec.decode(record)
        self.react(event, record)


class Reactors:
    """Starts and stops a set of reactors together; thread-safe."""

    def __init__(
        self,
        store: EventStore,
        reactors: Sequence[Reactor[Any]],
        *,
        poll_interval: float = 1.0,
        recent: RecentEvents | None = None,
    ) -> None:
        self._store = store
        self._reactors = tuple(reactors)
        # The events this process's streams committed (see Writer.recent): not decoded again.
        self._recent = recent
        self._poll_interval = poll_interval
        self._subscriptions: list[Subscription] = []

    @property
    def running(self) -> bool:
        return any(s.running for s in self._subscriptions)

    def failures(self) -> list[str]:
        """What stopped a reactor (its failing event and error), for health reports."""
        return [str(s.failure) for s in self._subscriptions if s.failure is not None]

    def start(self) -> None:
        """Subscribe every reactor from its checkpoint and follow the log live."""
        self.stop()
        self._subscriptions = [self._subscribe(reactor, start=True) for reactor in self._reactors]
        log.info("reactors started", reactors=[r.name for r in self._reactors])

    def run_until_caught_up(self) -> int:
        """Without threads: react to everything up to the head; returns how many events."""
        if not self._subscriptions:
            self._subscriptions = [
                self._subscribe(reactor, start=False) for reactor in self._reactors
            ]
        return sum(s.run_until_caught_up() for s in self._subscriptions)

    def _subscribe(self, reactor: Reactor[Any], *, start: bool) -> Subscription:
        return self._store.subscribe(
            reactor.name,
            partial(reactor.handle, recent=self._recent),
            types=reactor.type_names(),
            poll_interval=self._poll_interval,
            start=start,
            handler_writes=False,
        )

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop every reactor (each finishes the event in hand)."""
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscription.stop(timeout)
        if subscriptions:
            log.info("reactors stopped", reactors=[s.name for s in subscriptions])
