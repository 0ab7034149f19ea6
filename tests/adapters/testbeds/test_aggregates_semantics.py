"""The testbeds' codecs carry the events of deletion, problem reports, application tracking,
requeueing and blocking: each registered under its context's name and round-tripping."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from fleetledger.adapters.runtime import Aggregate
from fleetledger.adapters.testbeds.aggregates import BATCH_JOB, SCHEDULING, TESTBED
from fleetledger.domain.codec import event_type_of, from_data, to_data
from fleetledger.domain.testbeds import batch_job, scheduling, testbed
from fleetledger.eventstore import EventStore

T0 = datetime(2025, 1, 1, tzinfo=UTC)

CASES: list[tuple[Aggregate[Any, Any, Any], str, object]] = [
    (TESTBED, "testbed-bed", testbed.ProblemsReported(("node n1 is too small",), T0)),
    (TESTBED, "testbed-bed", testbed.TestbedDeleted("bed", T0)),
    (
        TESTBED,
        "testbed-bed",
        testbed.ClusterObserved(
            (testbed.ObservedNode("n1", "1", 1000, 1024),),
            (testbed.ObservedPod("g", "uid-g", "n1", True, 0, 1, 1, failed=True),),
            T0,
        ),
    ),
    (BATCH_JOB, "batch-job-j1", batch_job.ApplicationCreated("j1", T0)),
    (BATCH_JOB, "batch-job-j1", batch_job.ApplicationLost("j1", "s1", T0)),
    (BATCH_JOB, "batch-job-j1", batch_job.JobDeleted("j1", T0)),
    (SCHEDULING, "scheduling-s1", scheduling.JobRequeued("j1", "gone", T0)),
    (SCHEDULING, "scheduling-s1", scheduling.SchedulingBlocked("j1", "too big", T0)),
    (SCHEDULING, "scheduling-s1", scheduling.SchedulingUnblocked("j1", T0)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: type(c[2]).__name__)
def test_new_events_round_trip_through_their_codec(
    case: tuple[Aggregate[Any, Any, Any], str, object], sqlite_store: EventStore
) -> None:
    """Appended through the aggregate's codec and read back, the event is equal, under its
    context's stored name."""
    aggregate, stream, event = case
    assert type(event) in aggregate.codec.event_types
    records = aggregate.codec.encode(stream, 1, [event], causation_ids=["test"], actor="test")
    sqlite_store.append(stream, records, expected_version=0)

    [stored] = sqlite_store.read_stream(stream)

    assert stored.type == event_type_of(event).name
    assert stored.type.startswith(f"{aggregate.name}.")
    assert aggregate.codec.decode(stored) == event


def test_an_observed_pod_recorded_before_failed_existed_reads_as_not_failed() -> None:
    """Observations already in the log have no ``failed`` field: they read as not failed."""
    event = testbed.ClusterObserved(
        (), (testbed.ObservedPod("g", "uid-g", "n1", True, 0, 1, 1),), T0
    )
    name, version, data = to_data(event)
    pods = data["pods"]
    assert isinstance(pods, list) and isinstance(pods[0], dict)
    del pods[0]["failed"]

    assert from_data(name, version, data) == event
