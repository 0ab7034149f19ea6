"""``fleetledger replay``: every read model rebuilt from position 0 up to a log position or a
recorded time, printing the state as of there.

The auditor's front door to ``dumpstate --as-of``: the same JSON on stdout (nodes and subnets,
byte for byte what ``dumpstate --as-of`` prints for the position reached), a time as well as a
position to stop at, and the log read once, with progress on stderr — a bar on a terminal, a log
line every ``--progress-every`` events otherwise — and a summary of the machine requests' read
model rebuilt along the way.

A time stops the replay before the first event *recorded* after it (the store's clock): the
state the controller had committed by then, in log order.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

import structlog

from fleetledger.adapters.cli.common import require_database
from fleetledger.adapters.cli.options import MAX_POSITION, Subcommands, add_url, count, position
from fleetledger.eventstore import EventStore, RecordedEvent, open_store
from fleetledger.eventstore._engine import resolve_url

if TYPE_CHECKING:
    from fleetledger.projections.machine_requests import MachineRequestsProjection

__all__ = ["Progress", "Replayed", "register", "replay", "run", "until"]

log = structlog.get_logger("cli")

_PAGE = 5000  # measured by ``bench replay``: fewer round trips, without a larger heap
_BAR_WIDTH = 30
_REDRAW_SECONDS = 0.1


def until(text: str) -> int | datetime:
    """``--until``: a log position (digits) or an ISO-8601 time with its zone."""
    if text.strip().isdigit():
        return int(position(text))
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a log position (0 to {MAX_POSITION}) or an ISO-8601 time such as "
            f"2025-01-01T12:00:00Z, not {text[:40]!r}"
        ) from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no time zone; add one (Z for UTC, or +02:00) so that it names one moment"
        )
    return moment.astimezone(UTC)


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "replay",
        help="rebuild every read model up to a position or time and print the state as JSON",
        description="Replay the log from position 0 through every read model, up to "
        "--until (a position, or the last event recorded at or before a time), and print the "
        "nodes' and subnets' state as of there: the JSON `dumpstate --as-of` prints.",
    )
    add_url(parser)
    parser.add_argument(
        "--until",
        type=until,
        metavar="POSITION|TIME",
        help="stop at this log position, or before the first event recorded after this "
        "ISO-8601 time (with its zone, e.g. 2025-01-01T12:00:00Z) (default: the head)",
    )
    parser.add_argument(
        "--progress-every",
        type=count(),
        default=10_000,
        metavar="N",
        help="when stderr is not a terminal, log progress every N events (default 10000)",
    )
    parser.set_defaults(run=run)


class Progress:
    """Replay progress on ``stream``: a bar redrawn in place on a terminal, else a structured
    log line every ``every`` events (a CI job's or a container's log keeps whole lines)."""

    def __init__(self, *, total: int, every: int, stream: TextIO) -> None:
        self._total = max(total, 1)
        self._every = every
        self._stream = stream
        self._terminal = stream.isatty()
        self._drawn_at = 0.0
        self._events = 0

    def advance(self, position: int) -> None:
        """One more event replayed, at ``position``."""
        self._events += 1
        if self._terminal:
            now = time.monotonic()
            if now - self._drawn_at >= _REDRAW_SECONDS:
                self._drawn_at = now
                self._draw(position)
        elif self._events % self._every == 0:
            log.info("replaying", events=self._events, position=position, of=self._total)

    def finish(self, position: int) -> None:
        if self._terminal:
            self._draw(position)
            self._stream.write("\n")
            self._stream.flush()

    def _draw(self, position: int) -> None:
        done = min(position / self._total, 1.0)
        filled = int(done * _BAR_WIDTH)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        self._stream.write(
            f"\rreplaying [{bar}] {done:4.0%} position {position:,}/{self._total:,} "
            f"({self._events:,} events)"
        )
        self._stream.flush()


class Replayed:
    """The read models one pass over the log rebuilds: nodes, subnets, and each grouper's
    machine requests (its stream names are the runtime's, found in the events' ``grouper``
    label)."""

    def __init__(self) -> None:
        from fleetledger.projections.nodes import NODE_EVENT_TYPE_NAMES, NodesProjection
        from fleetledger.projections.subnets import SUBNET_EVENT_TYPE_NAMES, SubnetsProjection

        self.nodes = NodesProjection()
        self.subnets = SubnetsProjection()
        self.requests: dict[str, MachineRequestsProjection] = {}
        self._node_types = frozenset(NODE_EVENT_TYPE_NAMES)
        self._subnet_types = frozenset(SUBNET_EVENT_TYPE_NAMES)
        self.position = 0
        self.recorded_at: datetime | None = None

    def apply(self, record: RecordedEvent) -> None:
        if record.type in self._node_types:
            self.nodes.apply(record)
        elif record.type in self._subnet_types:
            self.subnets.apply(record)
        elif record.type.startswith("vm."):
            grouper = record.metadata.get("grouper")
            if isinstance(grouper, str):
                self._requests_of(grouper).apply(record)
        self.position = record.global_position
        self.recorded_at = record.recorded_at

    def apply_page(self, records: Sequence[RecordedEvent]) -> None:
        """Fold ``records``, in log order, as :meth:`apply` folds each: the page is sorted by
        read model first, and each model folds its share at once. The models are independent
        of one another, so only the order within each one's share counts, which is the log's."""
        node_types, subnet_types = self._node_types, self._subnet_types
        node_records: list[RecordedEvent] = []
        subnet_records: list[RecordedEvent] = []
        to_nodes, to_subnets = node_records.append, subnet_records.append
        for record in records:
            type_ = record.type
            if type_ in node_types:
                to_nodes(record)
            elif type_ in subnet_types:
                to_subnets(record)
            elif type_.startswith("vm."):
                grouper = record.metadata.get("grouper")
                if isinstance(grouper, str):
                    self._requests_of(grouper).apply(record)
        self.nodes.apply_page(node_records)
        self.subnets.apply_page(subnet_records)
        if records:
            self.position = records[-1].global_position
            self.recorded_at = records[-1].recorded_at

    def _requests_of(self, grouper: str) -> MachineRequestsProjection:
        found = self.requests.get(grouper)
        if found is None:
            # Imported here, once per grouper: an import statement costs a lookup in
            # sys.modules even when done, and this runs for every machine event replayed.
            from fleetledger.adapters.machines.streams import (
                batch_stream_prefix,
                grouper_stream_id,
            )
            from fleetledger.projections.machine_requests import MachineRequestsProjection

            found = self.requests[grouper] = MachineRequestsProjection(
                grouper_stream=grouper_stream_id(grouper),
                batch_stream_prefix=batch_stream_prefix(grouper),
            )
        return found

    def dump(self, position: int) -> dict[str, object]:
        """Dumpstate as of ``position``: what ``dumpstate --as-of`` prints for it."""
        from fleetledger.projections.nodes import dump_of

        return {
            **dump_of(self.nodes.states(), position),
            "subnets": self.subnets.dump()["subnets"],
        }

    def summary(self, position: int) -> str:
        requests = ", ".join(
            f"{grouper}: "
            + (", ".join(f"{n} {status}" for status, n in sorted(model.counts().items())) or "none")
            for grouper, model in sorted(self.requests.items())
        )
        present = sum(1 for state in self.nodes.states().values() if state.present)
        return (
            f"replayed to position {position}"
            + (f" (recorded {self.recorded_at.isoformat()})" if self.recorded_at else "")
            + f": {present} node(s), {len(self.subnets.subnets())} subnet(s), machine requests "
            + (requests or "none")
        )


def replay(
    store: EventStore, target: int | datetime | None, *, progress: Progress | None = None
) -> tuple[Replayed, int]:
    """Every read model rebuilt from position 0 up to ``target`` (a position, the last event
    recorded at or before a time, or the head); the models and the position reached.
    ``ValueError`` for a position the log has not reached."""
    from fleetledger.projections._reading import bulk_read, log_pages

    head = store.head()
    if isinstance(target, int) and target > head:
        raise ValueError(f"position {target} is outside the log (0 to {head}); pick one in it")
    last = target if isinstance(target, int) else head
    by_time = target if isinstance(target, datetime) else None
    models = Replayed()
    reached = 0
    with bulk_read():
        for page in log_pages(store, page=_PAGE):
            records = page[: _folded_part(page, last, by_time)]
            models.apply_page(records)
            if records:
                reached = records[-1].global_position
            if progress is not None:
                for record in records:
                    progress.advance(record.global_position)
            if len(records) < len(page) or reached >= last:
                break
    # A position between two events (a gap in the log's positions) is still that position.
    return models, last if by_time is None else reached


def _folded_part(page: list[RecordedEvent], last: int, by_time: datetime | None) -> int:
    """How many of ``page``'s records a replay up to position ``last`` folds, stopping before
    the first one recorded after ``by_time`` (if given)."""
    for index, record in enumerate(page):
        if record.global_position > last or (by_time is not None and record.recorded_at > by_time):
            return index
    return len(page)


def run(args: argparse.Namespace) -> int:
    from fleetledger.projections.nodes import dump_json

    require_database(resolve_url(args.url))
    with open_store(args.url) as store:
        total = args.until if isinstance(args.until, int) else store.head()
        progress = Progress(total=total, every=args.progress_every, stream=sys.stderr)
        models, reached = replay(store, args.until, progress=progress)
        progress.finish(reached)
    print(dump_json(models.dump(reached)))
    print(models.summary(reached), file=sys.stderr)
    return 0
