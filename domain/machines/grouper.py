"""The Grouper: collects machine requests into one pending batch per template and seals them.

Seed 01 ("Timing Strategy"): a pending batch is sealed when it is *full* (reaches
``max_batch_size``), *idle* (no request for its template for ``idle_timeout``), at *max*
(``max_timeout`` since its first request), alone at once for a *skip*-batching request, or at
*shutdown*. The original could overshoot the size; here the request that fills a batch seals it in
the same decision, so no batch is ever larger than ``max_batch_size``. That holds across a lowered
limit too: a batch that grew under a larger ``max_batch_size`` (pending when the process stopped)
is sealed in parts, each within the current limit — the first part keeps the batch's id, part
``k`` is ``<id>.<k>`` — all in the one decision that seals it.

A batch is sealed in parts by size too. The log refuses an event over its size limit, and a seal
lists every machine of its batch: a burst of requests with large tags could decide a seal that can
never be stored, so sealing would fail on every tick and the batch's requests would wait for
ever. With ``GrouperConfig.max_seal_bytes`` set (the runtime derives it from the log's limit), a
batch whose machines would not fit in one seal is sealed in parts that each fit, as above; and a
request too large to be sealed even alone is refused when it arrives, before anything is recorded.
The grouper knows nothing of the log: it bounds what its own events need, from the requests'
text (:func:`seal_size`).

Time is logical. Every command carries ``at`` and, before anything else, seals each batch whose
deadline is at or before it, exactly as a ``Tick(at)`` would. A sealed-by-time batch is stamped
with its *deadline*, not with the command that noticed it, so the events are the same whether the
runtime ticked on time, late, or not at all before the next request. Time never runs backwards
inside one grouper: a command stamped earlier than the latest event is treated as arriving then.

Bookkeeping for idempotency lives here too: a request id names one attempt (repeating it with the
same content changes nothing, with different content is refused), and a machine name is held from
its request until its batch reports it failed (:class:`RecordBatchOutcomes`); a created name is
held for good.

``decide`` takes the :class:`GrouperConfig` as an argument: the timeouts are policy, not state, and
the events never depend on them except through the decisions already recorded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Generic, Literal, TypeAlias, TypeVar, cast, get_args

from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.template import (
    UNSAFE_CHARACTERS,
    MachineTemplate,
    check_template,
    check_text,
    template_hash,
)

__all__ = [
    "BatchMachine",
    "BatchOutcomesRecorded",
    "BatchSealed",
    "GrouperCommand",
    "GrouperConfig",
    "GrouperEvent",
    "GrouperState",
    "Ledger",
    "MACHINE_NAME_PATTERN",
    "MAX_REQUEST_ID_LENGTH",
    "MAX_TAGS",
    "MAX_TAG_KEY_LENGTH",
    "MAX_TAG_VALUE_LENGTH",
    "MAX_ZONES",
    "MAX_ZONE_LENGTH",
    "MachineRequested",
    "PendingBatch",
    "RecordBatchOutcomes",
    "RequestMachine",
    "RequestStatus",
    "SEAL_REASONS",
    "SealReason",
    "Shutdown",
    "TAG_KEY_FORBIDDEN",
    "Tick",
    "decide",
    "evolve",
    "initial_state",
    "next_deadline",
    "pending_batches",
    "pending_request_count",
    "request_status",
    "seal_size",
    "sealed_batch_id",
]

SealReason = Literal["full", "idle", "max", "skip", "shutdown"]
SEAL_REASONS: tuple[SealReason, ...] = get_args(SealReason)

RequestStatus = Literal["pending", "sealed", "created", "failed"]
_Outcome = Literal["created", "failed"]

# -- request limits ------------------------------------------------------------------------------
# What Azure accepts, refused here before anything is recorded: a request Azure would refuse can
# only fail later, and one the log cannot store would stop the grouper (see ``check_text``).

MACHINE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A machine name becomes the VM's host name and its Kubernetes node name: an RFC 1123 label."""
MAX_REQUEST_ID_LENGTH = 128
MAX_ZONES = 3
"""Azure regions have at most three availability zones."""
MAX_ZONE_LENGTH = 64
MAX_TAGS = 50
"""Azure allows at most 50 tags per resource."""
MAX_TAG_KEY_LENGTH = 512
MAX_TAG_VALUE_LENGTH = 256
TAG_KEY_FORBIDDEN = "<>%&\\?/"
"""Characters Azure refuses in tag names."""

_MACHINE_NAME = re.compile(MACHINE_NAME_PATTERN)
_TAG_KEY_REFUSED = re.compile(f"[{re.escape(TAG_KEY_FORBIDDEN)}]")
_KEY_REFUSED = re.compile(f"[{UNSAFE_CHARACTERS}{re.escape(TAG_KEY_FORBIDDEN)}]")
_UNSAFE_TEXT = re.compile(f"[{UNSAFE_CHARACTERS}]")


# -- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GrouperConfig:
    """How long and how large a batch may grow. Validated once, here.

    ``max_seal_bytes`` bounds one seal's :func:`seal_size`; a batch over it is sealed in parts
    and a request over it alone is refused. ``None`` leaves seals bounded by count only.
    """

    idle_timeout: timedelta
    max_timeout: timedelta
    max_batch_size: int
    _: KW_ONLY
    max_seal_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.idle_timeout, timedelta) or self.idle_timeout <= timedelta(0):
            raise InvalidCommand(
                f"idle_timeout must be a positive duration (e.g. 500 ms), got {self.idle_timeout!r}"
            )
        if not isinstance(self.max_timeout, timedelta) or self.max_timeout <= timedelta(0):
            raise InvalidCommand(
                f"max_timeout must be a positive duration (e.g. 5 s), got {self.max_timeout!r}"
            )
        if self.idle_timeout > self.max_timeout:
            raise InvalidCommand(
                f"idle_timeout ({self.idle_timeout}) must not exceed max_timeout "
                f"({self.max_timeout}): raise max_timeout or lower idle_timeout"
            )
        if type(self.max_batch_size) is not int or self.max_batch_size < 1:
            raise InvalidCommand(
                f"max_batch_size must be a positive integer (10-50 is typical), "
                f"got {self.max_batch_size!r}"
            )
        if self.max_seal_bytes is not None and (
            type(self.max_seal_bytes) is not int or self.max_seal_bytes < 1
        ):
            raise InvalidCommand(
                f"max_seal_bytes must be a positive integer or None (no size bound), "
                f"got {self.max_seal_bytes!r}"
            )

    @classmethod
    def default(cls) -> GrouperConfig:
        """The original's defaults: idle 1 s, max 5 s, 50 machines per batch."""
        return cls(
            idle_timeout=timedelta(seconds=1),
            max_timeout=timedelta(seconds=5),
            max_batch_size=50,
        )


# -- value objects -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchMachine:
    """One machine of a batch: its request and the per-machine variations of the template."""

    request_id: str
    machine_name: str
    zones: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestMachine:
    """Ask for one machine. ``tags`` are (key, value) pairs; their order does not matter."""

    request_id: str
    machine_name: str
    template: MachineTemplate
    zones: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    skip_batching: bool = False
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class Tick:
    """Time has reached ``at``: seal every batch whose deadline has passed."""

    at: datetime


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Seal everything still pending, so no request is left behind by a stopping process."""

    at: datetime


@dataclass(frozen=True, slots=True)
class RecordBatchOutcomes:
    """Report terminal outcomes of a sealed batch's requests (all at once or a few at a time).

    Failed requests release their machine names; created ones keep them for good.
    """

    batch_id: str
    created_request_ids: tuple[str, ...] = ()
    failed_request_ids: tuple[str, ...] = ()
    _: KW_ONLY
    at: datetime


GrouperCommand: TypeAlias = RequestMachine | Tick | Shutdown | RecordBatchOutcomes


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MachineRequested:
    """A request was accepted into batch ``batch_id`` (pending, or sealed at once when skipping)."""

    request_id: str
    machine_name: str
    template: MachineTemplate
    template_hash: str
    zones: tuple[str, ...]
    tags: tuple[tuple[str, str], ...]
    skip_batching: bool
    batch_id: str
    at: datetime


@dataclass(frozen=True, slots=True)
class BatchSealed:
    """A batch will take no more requests. Self-contained: the executor needs nothing else."""

    batch_id: str
    template_hash: str
    template: MachineTemplate
    request_ids: tuple[str, ...]
    machines: tuple[BatchMachine, ...]
    reason: SealReason
    at: datetime


@dataclass(frozen=True, slots=True)
class BatchOutcomesRecorded:
    """Terminal outcomes newly learnt for requests of a sealed batch."""

    batch_id: str
    created_request_ids: tuple[str, ...]
    failed_request_ids: tuple[str, ...]
    at: datetime


GrouperEvent: TypeAlias = MachineRequested | BatchSealed | BatchOutcomesRecorded


# -- state ---------------------------------------------------------------------------------------

_V = TypeVar("_V")

# A persistent map keyed by strings, in the "logarithmic method" (Bentley & Saxe) shape of an
# LSM tree: a few immutable dicts ("runs"), newest first, whose sizes roughly double towards the
# oldest. The grouper remembers every request id and every held machine name for as long as its
# stream lives, so copying one dict per event would make each request cost O(requests so far).
# Here an update adds one small run and merges it with the newest runs while they are no larger —
# a C-speed dict merge; each key is copied O(log n) times over its life, and a lookup probes
# O(log n) dicts. Removals are tombstones, dropped once they reach the oldest run. No dict is ever
# mutated after it is published, so every earlier version of the map stays valid.
_REMOVED = object()


class _PersistentMap(Generic[_V]):
    __slots__ = ("_runs",)

    _runs: tuple[dict[str, object], ...]

    def __init__(self, runs: tuple[dict[str, object], ...] = ()) -> None:
        self._runs = runs

    def get(self, key: str) -> _V | None:
        for run in self._runs:
            value = run.get(key, run)
            if value is not run:
                return None if value is _REMOVED else cast("_V", value)
        return None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def update(self, items: Iterable[tuple[str, _V]]) -> _PersistentMap[_V]:
        """A map with every ``(key, value)`` of ``items`` set (later pairs win)."""
        return self._with_run(dict(items))

    def remove(self, keys: Iterable[str]) -> _PersistentMap[_V]:
        """A map without ``keys`` (absent keys are ignored)."""
        return self._with_run({key: _REMOVED for key in keys if self.get(key) is not None})

    def _with_run(self, run: dict[str, object]) -> _PersistentMap[_V]:
        if not run:
            return self
        runs = self._runs
        merged = 0
        while merged < len(runs) and len(runs[merged]) <= len(run):
            run = {**runs[merged], **run}
            merged += 1
        if merged == len(runs) and _REMOVED in run.values():
            run = {key: value for key, value in run.items() if value is not _REMOVED}
        return _PersistentMap((run, *runs[merged:]))

    def items(self) -> Iterator[tuple[str, _V]]:
        """Live entries, in no particular order."""
        merged: dict[str, object] = {}
        for run in reversed(self._runs):
            merged.update(run)
        for key, value in merged.items():
            if value is not _REMOVED:
                yield key, cast("_V", value)

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _PersistentMap):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"_PersistentMap({dict(sorted(self.items()))!r})"


@dataclass(frozen=True, slots=True)
class PendingBatch:
    """A batch still taking requests for one template.

    ``requests`` holds the accepted requests in arrival order (the first fixes the batch id and
    the template); ``names`` maps their machine names to request ids. Both are small and copied
    per request; they reach the grouper-wide :class:`Ledger` in one bulk update when sealed.
    """

    requests: Mapping[str, MachineRequested]
    names: Mapping[str, str]
    first_at: datetime
    last_at: datetime

    @property
    def first(self) -> MachineRequested:
        """The request that opened the batch."""
        return next(iter(self.requests.values()))

    @property
    def batch_id(self) -> str:
        """The id the batch will be sealed under."""
        return self.first.batch_id

    @property
    def template_hash(self) -> str:
        """The hash every request of the batch shares."""
        return self.first.template_hash

    @property
    def template(self) -> MachineTemplate:
        """The template as the first request spelled it (all share its hash)."""
        return self.first.template

    @property
    def size(self) -> int:
        """How many requests the batch holds."""
        return len(self.requests)

    @property
    def machines(self) -> tuple[BatchMachine, ...]:
        """The batch's machines in request order, as they will be sealed."""
        return tuple(
            BatchMachine(r.request_id, r.machine_name, r.zones, r.tags)
            for r in self.requests.values()
        )


@dataclass(frozen=True, slots=True)
class Ledger:
    """What the grouper remembers about requests once their batch is sealed.

    ``requests`` keeps each request's event (its content is the idempotency key); ``outcomes``
    the terminal outcome of requests whose batch reported one; ``names`` maps every held machine
    name (being created, or created) to the request holding it; ``sealed_in`` names the batch of
    requests sealed under another id than the one they were accepted into (a later part of a
    batch split when sealed; see :func:`sealed_batch_id`).
    """

    requests: _PersistentMap[MachineRequested] = field(default_factory=_PersistentMap)
    outcomes: _PersistentMap[_Outcome] = field(default_factory=_PersistentMap)
    names: _PersistentMap[str] = field(default_factory=_PersistentMap)
    sealed_in: _PersistentMap[str] = field(default_factory=_PersistentMap)


@dataclass(frozen=True, slots=True)
class GrouperState:
    """Pending batches by template hash, the ledger of sealed requests, and logical time.

    Requests and names of pending batches live in the batches until sealing, so the per-request
    cost stays independent of how many requests the stream has ever seen.
    """

    pending: Mapping[str, PendingBatch] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)
    batches_opened: int = 0
    clock: datetime | None = None


def initial_state() -> GrouperState:
    """A grouper that has seen nothing."""
    return GrouperState()


def _find_request(state: GrouperState, request_id: str) -> MachineRequested | None:
    found = state.ledger.requests.get(request_id)
    if found is None:
        for batch in state.pending.values():
            found = batch.requests.get(request_id)
            if found is not None:
                break
    return found


def _find_name_holder(state: GrouperState, machine_name: str) -> str | None:
    found = state.ledger.names.get(machine_name)
    if found is None:
        for batch in state.pending.values():
            found = batch.names.get(machine_name)
            if found is not None:
                break
    return found


# -- evolve --------------------------------------------------------------------------------------


def evolve(state: GrouperState, event: GrouperEvent) -> GrouperState:
    """Apply one event. Events are facts: nothing here refuses them."""
    if type(event) is MachineRequested:
        return _apply_requested(state, event)
    if type(event) is BatchSealed:
        return _apply_sealed(state, event)
    if type(event) is BatchOutcomesRecorded:
        return _apply_outcomes(state, event)
    raise TypeError(f"not a grouper event: {event!r}")


def _apply_requested(state: GrouperState, event: MachineRequested) -> GrouperState:
    clock = state.clock
    at = event.at
    if clock is not None and clock > at:
        at = clock
    if event.skip_batching:
        # A skip request's batch is sealed by the very next event; it never sits in ``pending``.
        ledger = state.ledger
        return GrouperState(
            state.pending,
            Ledger(
                ledger.requests.update(((event.request_id, event),)),
                ledger.outcomes,
                ledger.names.update(((event.machine_name, event.request_id),)),
                ledger.sealed_in,
            ),
            state.batches_opened + 1,
            at,
        )
    opened = state.batches_opened
    current = state.pending.get(event.template_hash)
    if current is not None and next(iter(current.requests.values())).batch_id == event.batch_id:
        batch = PendingBatch(
            {**current.requests, event.request_id: event},
            {**current.names, event.machine_name: event.request_id},
            current.first_at,
            at,
        )
    else:
        opened += 1
        batch = PendingBatch(
            {event.request_id: event}, {event.machine_name: event.request_id}, at, at
        )
    pending = dict(state.pending)
    pending[event.template_hash] = batch
    return GrouperState(pending, state.ledger, opened, at)


def _apply_sealed(state: GrouperState, event: BatchSealed) -> GrouperState:
    pending = state.pending
    ledger = state.ledger
    current = pending.get(event.template_hash)
    if current is None:
        pass
    elif current.batch_id == event.batch_id and len(event.request_ids) == len(current.requests):
        pending = {h: b for h, b in pending.items() if h != event.template_hash}
        ledger = Ledger(
            ledger.requests.update(current.requests.items()),
            ledger.outcomes,
            ledger.names.update(current.names.items()),
            ledger.sealed_in,
        )
    elif event.request_ids and all(r in current.requests for r in event.request_ids):
        pending, ledger = _apply_sealed_part(pending, ledger, current, event)
    return GrouperState(pending, ledger, state.batches_opened, _later(state.clock, event.at))


def _apply_sealed_part(
    pending: Mapping[str, PendingBatch],
    ledger: Ledger,
    current: PendingBatch,
    event: BatchSealed,
) -> tuple[Mapping[str, PendingBatch], Ledger]:
    """One part of a pending batch split when sealed; the rest stays pending until its part."""
    sealed = set(event.request_ids)
    moved = [(r, current.requests[r]) for r in event.request_ids]
    remaining = {r: e for r, e in current.requests.items() if r not in sealed}
    rest = {h: b for h, b in pending.items() if h != event.template_hash}
    if remaining:
        rest[event.template_hash] = PendingBatch(
            remaining,
            {n: r for n, r in current.names.items() if r not in sealed},
            current.first_at,
            current.last_at,
        )
    renamed = [(r, event.batch_id) for r, e in moved if e.batch_id != event.batch_id]
    return rest, Ledger(
        ledger.requests.update(moved),
        ledger.outcomes,
        ledger.names.update((e.machine_name, r) for r, e in moved),
        ledger.sealed_in.update(renamed) if renamed else ledger.sealed_in,
    )


def _apply_outcomes(state: GrouperState, event: BatchOutcomesRecorded) -> GrouperState:
    ledger = state.ledger
    outcomes = ledger.outcomes.update(
        [(r, "created") for r in event.created_request_ids]
        + [(r, "failed") for r in event.failed_request_ids]
    )
    # A failed request releases its name — if it still holds it, which it always should.
    released = []
    for request_id in event.failed_request_ids:
        request = ledger.requests.get(request_id)
        if request is not None and ledger.names.get(request.machine_name) == request_id:
            released.append(request.machine_name)
    return GrouperState(
        state.pending,
        Ledger(ledger.requests, outcomes, ledger.names.remove(released), ledger.sealed_in),
        state.batches_opened,
        _later(state.clock, event.at),
    )


def _later(clock: datetime | None, at: datetime) -> datetime:
    return at if clock is None or at > clock else clock


# -- seal size -----------------------------------------------------------------------------------
# A machine is carried whole by three events of its batch: the seal, the batch stream's opening
# (a copy of the seal) and each dispatch, whose ``BatchPutMachine`` header is JSON text stored
# inside the event's JSON, so every quote and backslash of it is escaped twice. The bound below
# takes, per machine, the most that any of them needs. Per text: its UTF-8 bytes, up to three
# escape bytes per quote or backslash, and its quotes (escaped in the header). Control
# characters, which JSON would spell in six bytes, are refused before any request is accepted.
# Per machine, per tag and per zone: the punctuation and field names around them, with room to
# spare (tests check the bound against the encoded events). What every event has whatever its
# machines (ids, times, metadata) is the caller's margin, not part of the bound.
_MACHINE_FRAME_BYTES = 160
_TAG_FRAME_BYTES = 8
_ZONE_FRAME_BYTES = 4


def _machines_bytes(machines: Iterable[BatchMachine]) -> int:
    """The bound for ``machines`` together (see above), in one pass over their joined text."""
    # The request id is written twice in each event: with the machine, and in the list of
    # request ids (the seal's ``request_ids``; the dispatch's, beside the header's request tag).
    texts: list[str] = []
    frames = 0
    for machine in machines:
        texts += (machine.request_id, machine.request_id, machine.machine_name, *machine.zones)
        for tag in machine.tags:
            texts += tag
        frames += (
            _MACHINE_FRAME_BYTES
            + _TAG_FRAME_BYTES * len(machine.tags)
            + _ZONE_FRAME_BYTES * len(machine.zones)
        )
    text = "".join(texts)
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return size + 3 * (text.count('"') + text.count("\\")) + 4 * len(texts) + frames


@lru_cache(maxsize=256)
def _template_bytes(template: MachineTemplate) -> int:
    text = json.dumps(template.to_data(), ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", "surrogatepass"))


def seal_size(template: MachineTemplate, machines: Iterable[BatchMachine]) -> int:
    """A bound on the bytes a seal of ``machines`` from ``template`` needs in the log's events.

    It covers the template and the machines as the seal, its batch's opening and a dispatch with
    its ``BatchPutMachine`` header carry them; not the few hundred bytes each event has besides
    (ids, times, metadata), which whoever sets :attr:`GrouperConfig.max_seal_bytes` leaves aside.
    """
    return _template_bytes(template) + _machines_bytes(machines)


def _split(
    template: MachineTemplate,
    machines: Sequence[BatchMachine],
    limit: int,
    max_bytes: int | None,
) -> list[tuple[int, int]]:
    """``machines`` cut, in order, into ``(start, stop)`` parts of at most ``limit`` machines
    and, if ``max_bytes`` is set, at most that :func:`seal_size` (a machine over it goes alone:
    only a request accepted under a larger bound can be)."""
    if max_bytes is None:
        return [
            (start, min(start + limit, len(machines))) for start in range(0, len(machines), limit)
        ]
    frame = _template_bytes(template)
    if len(machines) <= limit and frame + _machines_bytes(machines) <= max_bytes:
        return [(0, len(machines))]  # the common case: the batch fits in one seal
    parts: list[tuple[int, int]] = []
    start = 0
    size = frame
    for index, machine in enumerate(machines):
        machine_size = _machines_bytes((machine,))
        if index > start and (index - start >= limit or size + machine_size > max_bytes):
            parts.append((start, index))
            start, size = index, frame
        size += machine_size
    if start < len(machines):
        parts.append((start, len(machines)))
    return parts


def _check_seal_fits(
    command: RequestMachine, tags: tuple[tuple[str, str], ...], max_bytes: int
) -> None:
    machine = BatchMachine(command.request_id, command.machine_name, command.zones, tags)
    template = _template_bytes(command.template)
    own = _machines_bytes((machine,))
    if template + own <= max_bytes:
        return
    # Named by the larger part, so the caller knows what to shorten (the message starts with the
    # field, as every refusal of a request's field does).
    what, advice = (
        ("tags", "send fewer or shorter tags")
        if own >= template
        else ("template", "shorten its kubelet_config or texts")
    )
    raise InvalidCommand(
        f"{what} too large to seal: request {command.request_id!r} needs {template + own} bytes "
        f"in a seal (template {template}, machine {own}), over the {max_bytes} one seal may "
        f"hold; {advice}"
    )


# -- decide --------------------------------------------------------------------------------------


def decide(
    state: GrouperState, command: GrouperCommand, config: GrouperConfig
) -> list[GrouperEvent]:
    """Decide what ``command`` means now. Raises :class:`Rejected` / :class:`InvalidCommand`.

    Every command first seals the batches that are due at its time (see the module docstring);
    an exact repeat of an accepted request is the exception: it returns ``[]`` and changes nothing.
    """
    at = _effective_time(state, command.at)
    if type(command) is RequestMachine:
        return _decide_request(state, command, config, at)
    if isinstance(command, Tick):
        return _seal_due(state, config, at)
    if isinstance(command, Shutdown):
        return _decide_shutdown(state, config, at)
    if isinstance(command, RecordBatchOutcomes):
        return _decide_outcomes(state, command, config, at)
    raise InvalidCommand(f"the grouper does not handle {type(command).__name__}")


def _effective_time(state: GrouperState, at: object) -> datetime:
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidCommand(f"at must be a timezone-aware UTC datetime, got {at!r}")
    if at.utcoffset():
        at = at.astimezone(UTC)
    clock = state.clock
    return clock if clock is not None and clock > at else at


def _decide_request(
    state: GrouperState, command: RequestMachine, config: GrouperConfig, at: datetime
) -> list[GrouperEvent]:
    tags = _validated_request(command)
    digest = template_hash(command.template)
    request_id = command.request_id
    name = command.machine_name
    ledger = state.ledger
    seen = ledger.requests.get(request_id) is not None or ledger.names.get(name) is not None
    if not seen:
        for batch in state.pending.values():
            if request_id in batch.requests or name in batch.names:
                seen = True
                break
    if seen:
        _check_repeat(state, command, digest, tags)
        return []

    if config.max_seal_bytes is not None:
        _check_seal_fits(command, tags, config.max_seal_bytes)
    events = _seal_due(state, config, at)
    if command.skip_batching:
        batch_id = _batch_id(digest, state.batches_opened + 1)
        machine = BatchMachine(command.request_id, command.machine_name, command.zones, tags)
        events.append(_requested(command, digest, tags, batch_id, at))
        events.append(
            BatchSealed(
                batch_id, digest, command.template, (command.request_id,), (machine,), "skip", at
            )
        )
        return events

    current = state.pending.get(digest)
    if current is not None and events and any(e.batch_id == current.batch_id for e in events):
        current = None  # just sealed as due (or over-full after the size was lowered)
    if current is None:
        batch_id = _batch_id(digest, state.batches_opened + 1)
        size = 1
    else:
        batch_id = current.batch_id
        size = len(current.requests) + 1
    events.append(_requested(command, digest, tags, batch_id, at))
    if size >= config.max_batch_size:
        machine = BatchMachine(command.request_id, command.machine_name, command.zones, tags)
        machines = (machine,) if current is None else (*current.machines, machine)
        template = command.template if current is None else current.template
        events.extend(
            _sealed_parts(batch_id, digest, template, machines, reason="full", at=at, config=config)
        )
    return events


def _check_repeat(
    state: GrouperState,
    command: RequestMachine,
    digest: str,
    tags: tuple[tuple[str, str], ...],
) -> None:
    """Return if ``command`` repeats an accepted request exactly; otherwise say why it cannot be."""
    previous = _find_request(state, command.request_id)
    if previous is not None:
        if _same_request(previous, command, digest, tags):
            return
        raise Rejected(
            f"request id {command.request_id!r} was already used for a different request "
            f"(machine {previous.machine_name!r}, template {previous.template_hash}); "
            "use a new request id"
        )
    holder = _find_name_holder(state, command.machine_name) or "?"
    raise Rejected(_name_taken_reason(state, command.machine_name, holder))


def _validated_request(command: RequestMachine) -> tuple[tuple[str, str], ...]:
    """Check the per-machine fields; return the tags in their one canonical order."""
    if not isinstance(command.request_id, str) or not command.request_id:
        raise InvalidCommand("request_id must be a non-empty string")
    check_text("request_id", command.request_id, max_length=MAX_REQUEST_ID_LENGTH)
    _check_machine_name(command.machine_name)
    if not isinstance(command.template, MachineTemplate):
        raise InvalidCommand("template must be a MachineTemplate")
    check_template(command.template)
    _check_zones(command.zones)
    return _canonical_tags(command.tags)


def _check_machine_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidCommand("machine_name must be a non-empty string")
    if _MACHINE_NAME.match(name) is None:
        raise InvalidCommand(
            f"machine_name must be 1-63 lowercase letters, digits and '-', starting and ending "
            f"with a letter or digit (it becomes the node's host name), got {name[:80]!r}"
        )


def _check_zones(zones: object) -> None:
    if type(zones) is not tuple:
        raise InvalidCommand(f"zones must be a tuple of zone names like ('1', '2'), got {zones!r}")
    if len(zones) > MAX_ZONES:
        raise InvalidCommand(f"zones lists {len(zones)} zones; Azure regions have {MAX_ZONES}")
    for zone in zones:
        if not isinstance(zone, str) or not zone:
            raise InvalidCommand(f"zones must be non-empty zone names like '1', got {zone!r}")
        check_text("zones entry", zone, max_length=MAX_ZONE_LENGTH)
    if len(zones) > 1 and len(set(zones)) != len(zones):
        raise InvalidCommand(f"zones lists a zone twice: {zones!r}; give each zone once")


def _canonical_tags(tags: object) -> tuple[tuple[str, str], ...]:
    if type(tags) is not tuple:
        raise InvalidCommand(f"tags must be a tuple of (key, value) pairs, got {tags!r}")
    if len(tags) > MAX_TAGS:
        raise InvalidCommand(f"tags hold {len(tags)} entries; Azure allows at most {MAX_TAGS}")
    for pair in tags:
        if type(pair) is not tuple or len(pair) != 2:
            raise InvalidCommand(f"each tag must be a (key, value) pair, got {pair!r}")
        key, value = pair
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise InvalidCommand(f"tag keys must be non-empty strings, values strings: {pair!r}")
        _check_tag(key, value)
    if len(tags) < 2:
        return tags
    canonical = tuple(sorted(tags))
    keys = {key for key, _ in canonical}
    if len(keys) != len(canonical):
        raise InvalidCommand(f"tags set a key more than once: {tags!r}; give each key once")
    return canonical


def _check_tag(key: str, value: str) -> None:
    # Every request's every tag passes here: the common, valid case in two searches and no
    # message built; anything else goes through the checks that say what is wrong.
    if (
        len(key) <= MAX_TAG_KEY_LENGTH
        and len(value) <= MAX_TAG_VALUE_LENGTH
        and _KEY_REFUSED.search(key) is None
        and _UNSAFE_TEXT.search(value) is None
        and not key.isspace()
    ):
        return
    check_text("tags key", key, max_length=MAX_TAG_KEY_LENGTH)
    refused = _TAG_KEY_REFUSED.search(key)
    if refused is not None:
        raise InvalidCommand(
            f"tags key {key!r} contains {refused.group()}; Azure refuses "
            f"{' '.join(TAG_KEY_FORBIDDEN)} in tag names"
        )
    check_text(f"tags value of {key!r}", value, max_length=MAX_TAG_VALUE_LENGTH, blank=True)


def _same_request(
    previous: MachineRequested,
    command: RequestMachine,
    digest: str,
    tags: tuple[tuple[str, str], ...],
) -> bool:
    return (
        previous.machine_name == command.machine_name
        and previous.template_hash == digest
        and previous.zones == command.zones
        and previous.tags == tags
        and previous.skip_batching == command.skip_batching
    )


def _name_taken_reason(state: GrouperState, name: str, holder: str) -> str:
    request = _find_request(state, holder)
    batch_id = _sealed_batch_id(state, request) if request is not None else "?"
    if state.ledger.outcomes.get(holder) == "created":
        return (
            f"machine name {name!r} was already created by request {holder!r} "
            f"(batch {batch_id}); choose another name"
        )
    pending = request is not None and any(b.batch_id == batch_id for b in state.pending.values())
    where = "is pending in" if pending else "is being created by"
    return (
        f"machine name {name!r} {where} batch {batch_id} (request {holder!r}); "
        "wait for that request's outcome or choose another name"
    )


def _requested(
    command: RequestMachine,
    digest: str,
    tags: tuple[tuple[str, str], ...],
    batch_id: str,
    at: datetime,
) -> MachineRequested:
    return MachineRequested(
        command.request_id,
        command.machine_name,
        command.template,
        digest,
        command.zones,
        tags,
        command.skip_batching,
        batch_id,
        at,
    )


def _batch_id(digest: str, sequence: int) -> str:
    # The sequence counts batches opened by this grouper stream, so replaying the stream derives
    # the same ids; the hash makes ids readable (which template) and unique across templates.
    return f"{digest}-{sequence:08d}"


def _deadline(batch: PendingBatch, config: GrouperConfig) -> tuple[datetime, SealReason]:
    """When ``batch`` falls due, and why.

    Tie rule: when the idle and max deadlines coincide the reason is ``max`` — the latency bound
    was reached, which is the stronger statement. A batch already at ``max_batch_size`` (possible
    only if the size was lowered since it opened) is due at its last request, reason ``full``.
    """
    if len(batch.requests) >= config.max_batch_size:
        return batch.last_at, "full"
    idle = batch.last_at + config.idle_timeout
    hard = batch.first_at + config.max_timeout
    if hard <= idle:
        return hard, "max"
    return idle, "idle"


def _due_order(
    state: GrouperState, config: GrouperConfig, at: datetime | None
) -> list[tuple[datetime, str, PendingBatch, SealReason]]:
    """Pending batches (only those due at ``at``, unless ``None``) by deadline then hash."""
    due = []
    for batch in state.pending.values():
        deadline, reason = _deadline(batch, config)
        if at is None or deadline <= at:
            due.append((deadline, batch.template_hash, batch, reason))
    due.sort(key=lambda item: (item[0], item[1]))
    return due


def _seal_due(state: GrouperState, config: GrouperConfig, at: datetime) -> list[GrouperEvent]:
    """Seal, by deadline then template hash, every pending batch due at or before ``at``."""
    # Runs before every command, and almost always finds nothing due: check that cheaply first.
    idle_cut = at - config.idle_timeout
    max_cut = at - config.max_timeout
    size = config.max_batch_size
    for batch in state.pending.values():
        if batch.last_at <= idle_cut or batch.first_at <= max_cut or len(batch.requests) >= size:
            break
    else:
        return []
    return [
        part
        for deadline, _, batch, reason in _due_order(state, config, at)
        for part in _seal(batch, reason, _stamp(state, deadline), config)
    ]


def _stamp(state: GrouperState, deadline: datetime) -> datetime:
    # A batch sealed by time is stamped with its deadline so a late tick leaves the same record
    # as a punctual one; never earlier than the last event, so the stream's times stay monotonic
    # even if the timeouts were shortened since the batch opened.
    clock = state.clock
    return deadline if clock is None or deadline > clock else clock


def _seal(
    batch: PendingBatch, reason: SealReason, at: datetime, config: GrouperConfig
) -> list[BatchSealed]:
    """``batch`` sealed whole, or in parts if it is over the size or count limits (see
    :func:`_sealed_parts`)."""
    return _sealed_parts(
        batch.batch_id,
        batch.template_hash,
        batch.template,
        batch.machines,
        reason=reason,
        at=at,
        config=config,
    )


def _sealed_parts(
    batch_id: str,
    digest: str,
    template: MachineTemplate,
    machines: tuple[BatchMachine, ...],
    *,
    reason: SealReason,
    at: datetime,
    config: GrouperConfig,
) -> list[BatchSealed]:
    """One seal, or several of at most ``max_batch_size`` machines and ``max_seal_bytes`` each
    (a batch that grew under a larger limit, or whose machines are too large for one seal): the
    first keeps ``batch_id``, part ``k`` is ``<batch_id>.<k>``."""
    parts = _split(template, machines, config.max_batch_size, config.max_seal_bytes)
    return [
        BatchSealed(
            batch_id if k == 0 else f"{batch_id}.{k + 1}",
            digest,
            template,
            tuple(m.request_id for m in machines[start:stop]),
            machines[start:stop],
            reason,
            at,
        )
        for k, (start, stop) in enumerate(parts)
    ]


def _decide_shutdown(
    state: GrouperState, config: GrouperConfig, at: datetime
) -> list[GrouperEvent]:
    # Batches already due keep their own reason; the rest are sealed for the shutdown, in the
    # order they would have fallen due had the process kept running.
    events: list[GrouperEvent] = []
    for deadline, _, batch, reason in _due_order(state, config, None):
        if deadline <= at:
            events.extend(_seal(batch, reason, _stamp(state, deadline), config))
        else:
            events.extend(_seal(batch, "shutdown", at, config))
    return events


def _decide_outcomes(
    state: GrouperState, command: RecordBatchOutcomes, config: GrouperConfig, at: datetime
) -> list[GrouperEvent]:
    created = tuple(command.created_request_ids)
    failed = tuple(command.failed_request_ids)
    both = sorted(set(created) & set(failed))
    if both:
        raise InvalidCommand(
            f"request(s) {', '.join(both)} listed as both created and failed; give one outcome each"
        )
    for request_id in (*created, *failed):
        request = _find_request(state, request_id)
        if request is None or _sealed_batch_id(state, request) != command.batch_id:
            raise InvalidCommand(
                f"request {request_id!r} is not part of batch {command.batch_id}; "
                "report outcomes against the batch the request was sealed in"
            )
    if any(batch.batch_id == command.batch_id for batch in state.pending.values()):
        raise Rejected(
            f"batch {command.batch_id} is still pending; outcomes can only follow its sealing"
        )
    new_created = _new_outcomes(state, created, "created")
    new_failed = _new_outcomes(state, failed, "failed")
    events = _seal_due(state, config, at)
    if new_created or new_failed:
        events.append(BatchOutcomesRecorded(command.batch_id, new_created, new_failed, at))
    return events


def _new_outcomes(
    state: GrouperState, request_ids: tuple[str, ...], outcome: _Outcome
) -> tuple[str, ...]:
    fresh: list[str] = []
    for request_id in request_ids:
        known = state.ledger.outcomes.get(request_id)
        if known is None:
            if request_id not in fresh:
                fresh.append(request_id)
        elif known != outcome:
            raise Rejected(
                f"request {request_id!r} already ended {known}; a request has exactly one outcome"
            )
    return tuple(fresh)


# -- queries -------------------------------------------------------------------------------------


def next_deadline(state: GrouperState, config: GrouperConfig) -> datetime | None:
    """When the runtime should next send ``Tick``: the earliest idle/max deadline, if any."""
    if not state.pending:
        return None
    return min(_deadline(batch, config)[0] for batch in state.pending.values())


def pending_request_count(state: GrouperState) -> int:
    """Requests waiting in batches that are not sealed yet."""
    return sum(len(batch.requests) for batch in state.pending.values())


def pending_batches(state: GrouperState) -> tuple[PendingBatch, ...]:
    """Unsealed batches, oldest first (by first request, then template hash)."""
    return tuple(
        sorted(state.pending.values(), key=lambda batch: (batch.first_at, batch.template_hash))
    )


def request_status(state: GrouperState, request_id: str) -> tuple[RequestStatus, str] | None:
    """``(status, batch_id)`` of an accepted request, or ``None`` if the id is unknown.

    ``sealed`` means handed to its batch and awaiting an outcome.
    """
    request = _find_request(state, request_id)
    if request is None:
        return None
    outcome = state.ledger.outcomes.get(request_id)
    if outcome is not None:
        return outcome, _sealed_batch_id(state, request)
    pending = state.pending.get(request.template_hash)
    if pending is not None and request_id in pending.requests:
        return "pending", request.batch_id
    return "sealed", _sealed_batch_id(state, request)


def sealed_batch_id(state: GrouperState, request_id: str) -> str | None:
    """The batch ``request_id`` was sealed in (or waits in, if pending); ``None`` if unknown.

    Usually the batch it was accepted into (``MachineRequested.batch_id``); a request in a later
    part of a batch split when sealed has that part's id.
    """
    request = _find_request(state, request_id)
    return None if request is None else _sealed_batch_id(state, request)


def _sealed_batch_id(state: GrouperState, request: MachineRequested) -> str:
    return state.ledger.sealed_in.get(request.request_id) or request.batch_id
