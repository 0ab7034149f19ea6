"""The two machine-request aggregates as the decider host runs them.

The grouper (one stream per grouper name) decides with its configuration bound; each sealed
batch gets a batch stream of its own, named after the grouper that sealed it.
"""

from __future__ import annotations

from fleetledger.adapters.runtime import Aggregate
from fleetledger.domain import grouper, machine_batch
from fleetledger.domain.grouper import GrouperCommand, GrouperConfig, GrouperEvent, GrouperState
from fleetledger.domain.machine_batch import BatchCommand, BatchEvent, BatchState

from .records import BATCH_CODEC, GROUPER_CODEC
from .streams import batch_stream_id, grouper_stream_id

__all__ = ["batch_aggregate", "grouper_aggregate"]


def grouper_aggregate(
    config: GrouperConfig,
) -> Aggregate[GrouperState, GrouperCommand, GrouperEvent]:
    """The Grouper under ``config``; its stream is ``vmgrouper-<grouper name>``."""
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


def batch_aggregate(grouper_name: str) -> Aggregate[BatchState, BatchCommand, BatchEvent]:
    """The lifecycle of one batch sealed by ``grouper_name``; streams are keyed by batch id."""
    return Aggregate(
        name="batch",
        initial_state=machine_batch.initial_state,
        evolve=machine_batch.evolve,
        decide=machine_batch.decide,
        codec=BATCH_CODEC,
        stream_of=lambda batch_id: batch_stream_id(grouper_name, batch_id),
    )
