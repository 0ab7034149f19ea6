"""The two machine-request aggregates as the decider host runs them.

The grouper (one stream per grouper name) decides with its configuration bound; each sealed
batch gets a batch stream of its own, named after the grouper that sealed it.

The grouper cannot know the log's event size limit, yet a seal that the log refuses would fail on
every tick and leave its batch's requests waiting for ever. So the grouper is given a bound it can
check from the requests alone, ``GrouperConfig.max_seal_bytes`` (on what a seal's template and
machines take in the largest event carrying them: ``grouper.seal_size``), and this module derives
that bound from the log's limit, less :data:`SEAL_MARGIN_BYTES` for everything else such an
event holds. A byte bound rather than a machine count, because requests differ by two orders of
magnitude (one with no tags needs about 400 bytes of a seal, one with 50 long tags some 40 kB): a
count safe for the largest would cut ordinary batches into needless parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from fleetledger.adapters.runtime import Aggregate
from fleetledger.domain.machines import (
    BatchState,
    GrouperCommand,
    GrouperConfig,
    GrouperEvent,
    GrouperState,
    grouper,
)
from fleetledger.domain.machines import batch as machine_batch

from .records import BATCH_CODEC, GROUPER_CODEC
from .streams import batch_stream_id, grouper_stream_id
from .throttled import (
    BatchLogCommand,
    BatchLogEvent,
    BatchThrottled,
    RecordThrottle,
    decide_throttle,
)

__all__ = ["SEAL_MARGIN_BYTES", "batch_aggregate", "grouper_aggregate", "sealing_config"]

SEAL_MARGIN_BYTES = 4096
"""What an event carrying a seal's machines may hold besides them: the batch id, template hash,
times and field names (a few hundred bytes), a dispatch's call description, and the metadata — a
correlation and a causation id (a request id of up to 128 characters), the actor, the grouper's
name and a leader term. Some 1.5 kB at the very worst, partly covered by the slack of the bound
itself (a request filling the bound with 128-character ids needs about 100 bytes more, see
``tests/adapters/machines/test_poison_seals.py``); 4 kB leaves room for a long actor name."""


def sealing_config(config: GrouperConfig, max_event_bytes: int | None) -> GrouperConfig:
    """``config`` with ``max_seal_bytes`` no larger than what a log refusing events over
    ``max_event_bytes`` can store (``None``: the log's limit is not known; ``config`` as is).

    Raises ``ValueError`` for a limit too small to hold any seal.
    """
    if max_event_bytes is None:
        return config
    if type(max_event_bytes) is not int or max_event_bytes < 2 * SEAL_MARGIN_BYTES:
        raise ValueError(
            f"the event log's max_event_bytes ({max_event_bytes!r}) leaves no room for a batch's "
            f"seal: open the store with at least {2 * SEAL_MARGIN_BYTES} bytes per event"
        )
    bound = max_event_bytes - SEAL_MARGIN_BYTES
    if config.max_seal_bytes is not None and config.max_seal_bytes <= bound:
        return config
    return replace(config, max_seal_bytes=bound)


def grouper_aggregate(
    config: GrouperConfig, *, max_event_bytes: int | None = None
) -> Aggregate[GrouperState, GrouperCommand, GrouperEvent]:
    """The Grouper under ``config``; its stream is ``vmgrouper-<grouper name>``.

    With ``max_event_bytes`` (the log's limit) its seals are kept within it (see
    :func:`sealing_config`).
    """
    config = sealing_config(config, max_event_bytes)
    return Aggregate(
        name="grouper",
        initial_state=grouper.initial_state,
        evolve=grouper.evolve,
        decide=lambda state, command: grouper.decide(state, command, config),
        codec=GROUPER_CODEC,
        stream_of=grouper_stream_id,
        next_deadline=lambda state: grouper.next_deadline(state, config),
        tick=grouper.Tick,
    )


def batch_aggregate(grouper_name: str) -> Aggregate[BatchState, BatchLogCommand, BatchLogEvent]:
    """The lifecycle of one batch sealed by ``grouper_name``, with the runtime's throttling
    waits (:mod:`~fleetledger.adapters.machines.throttled`); streams are keyed by batch id."""
    return Aggregate(
        name="batch",
        initial_state=machine_batch.initial_state,
        evolve=_evolve_batch,
        decide=_decide_batch,
        codec=BATCH_CODEC,
        stream_of=lambda batch_id: batch_stream_id(grouper_name, batch_id),
    )


def _evolve_batch(state: BatchState, event: BatchLogEvent) -> BatchState:
    # A wait changes no request's fate.
    if isinstance(event, BatchThrottled):
        return state
    return machine_batch.evolve(state, event)


def _decide_batch(state: BatchState, command: BatchLogCommand) -> Sequence[BatchLogEvent]:
    if isinstance(command, RecordThrottle):
        return decide_throttle(state, command)
    return machine_batch.decide(state, command)
