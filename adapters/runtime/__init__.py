"""The decider host: one runtime for every pure aggregate.

A capability gives the host an :class:`Aggregate` — its ``initial_state``, ``evolve``, ``decide``
(and ``next_deadline`` with a ``tick`` command, if it keeps time), its :class:`EventCodec` and its
stream naming — and its reactors. The host owns the rest, once:

- :class:`HostedStream`: load (from a snapshot when the stream is long) and fold, decide on the
  cached state, append with the expected version, catch up and decide again on a conflict,
  re-send the same events when an append's outcome is unknown, batch the commands that arrive
  while an append is in flight into one append;
- :class:`ClockDriver`: send the tick when ``next_deadline`` passes, woken by changes;
- :class:`Reactors`: run side effects from checkpointed subscriptions of the log, only while
  this process leads;
- :class:`LogFollower`: keep an in-memory read model current;
- :class:`Leadership`: elect one leader per database — or per :class:`Shard`, a partition of a
  capability's aggregates — record each term in the log, fence deposed terms (the store refuses
  their appends) and step down at once when fenced;
- self-fencing (:class:`FencedCloud`, :class:`FencedCluster`, :class:`FencedApplications`): a
  leader past its lease's local deadline makes no more cloud or cluster calls;
- task runners for reactors' long work.
"""

from __future__ import annotations

from .aggregate import Aggregate, SnapshotCodec
from .appends import RetryPolicy, append_decision
from .codec import (
    EVENT_ID_NAMESPACE,
    LEADER_SHARD_KEY,
    LEADER_TERM_KEY,
    EventCodec,
    correlation_of,
    event_id,
    events_of,
)
from .driver import ClockDriver
from .duties import Duties
from .errors import CommandRefused, Deposed, HostError, LogContention, LogUnavailable
from .follower import LogFollower, ReadModel
from .leadership import (
    DutyFencing,
    FileLease,
    Leadership,
    Lease,
    MemoryLease,
    PostgresLease,
    lease_for,
)
from .reactors import Reactor, Reactors
from .runners import InlineRunner, TaskRunner, ThreadRunner
from .self_fencing import (
    FencedApplications,
    FencedCloud,
    FencedCluster,
    LeaseExpired,
    SelfFence,
)
from .shards import Shard, partition_of, shard_name
from .stream import (
    Companions,
    Decision,
    Fencing,
    Folded,
    HostedStream,
    NoFencing,
    Opening,
    Plan,
    Writer,
    execute_each,
    fencing_shard,
    opening_append,
)

__all__ = [
    "EVENT_ID_NAMESPACE",
    "LEADER_SHARD_KEY",
    "LEADER_TERM_KEY",
    "Aggregate",
    "ClockDriver",
    "CommandRefused",
    "Companions",
    "Decision",
    "Deposed",
    "Duties",
    "DutyFencing",
    "EventCodec",
    "FencedApplications",
    "FencedCloud",
    "FencedCluster",
    "FileLease",
    "Fencing",
    "Folded",
    "HostError",
    "HostedStream",
    "InlineRunner",
    "Lease",
    "LeaseExpired",
    "Leadership",
    "LogContention",
    "LogFollower",
    "LogUnavailable",
    "MemoryLease",
    "NoFencing",
    "Opening",
    "Plan",
    "PostgresLease",
    "ReadModel",
    "Reactor",
    "Reactors",
    "RetryPolicy",
    "SelfFence",
    "Shard",
    "SnapshotCodec",
    "TaskRunner",
    "ThreadRunner",
    "Writer",
    "append_decision",
    "correlation_of",
    "event_id",
    "events_of",
    "execute_each",
    "fencing_shard",
    "lease_for",
    "opening_append",
    "partition_of",
    "shard_name",
]
