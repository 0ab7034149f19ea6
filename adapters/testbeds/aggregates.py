"""The testbed, batch job and scheduling aggregates as the decider host runs them.

Each codec takes every event of its aggregate's union. The events added with deletion, problem
reports, application tracking and requeueing are registered here under their stored names too;
registering them again under the same name and version (as :mod:`fleetledger.domain.codec` does
for the others) is harmless.
"""

from __future__ import annotations

from fleetledger.adapters.runtime import Aggregate, EventCodec, events_of
from fleetledger.domain.codec import register_event
from fleetledger.domain.testbeds import (
    JobCommand,
    JobEvent,
    JobState,
    SchedulingCommand,
    SchedulingEvent,
    SchedulingState,
    TestbedCommand,
    TestbedEvent,
    TestbedState,
    batch_job,
    scheduling,
    testbed,
)

__all__ = ["BATCH_JOB", "SCHEDULING", "TESTBED"]

for _event, _name in (
    (testbed.ProblemsReported, "testbed.ProblemsReported"),
    (testbed.TestbedDeleted, "testbed.TestbedDeleted"),
    (batch_job.ApplicationCreated, "batch_job.ApplicationCreated"),
    (batch_job.ApplicationLost, "batch_job.ApplicationLost"),
    (batch_job.JobDeleted, "batch_job.JobDeleted"),
    (scheduling.JobRequeued, "scheduling.JobRequeued"),
    (scheduling.SchedulingBlocked, "scheduling.SchedulingBlocked"),
    (scheduling.SchedulingUnblocked, "scheduling.SchedulingUnblocked"),
):
    register_event(_name, 1)(_event)

TESTBED: Aggregate[TestbedState, TestbedCommand, TestbedEvent] = Aggregate(
    name="testbed",
    initial_state=testbed.initial_state,
    evolve=testbed.evolve,
    decide=testbed.decide,
    codec=EventCodec(
        "testbed",
        events_of(TestbedEvent),
        correlation_fields=("pod_name", "scheduling", "name"),
    ),
    stream_of=testbed.stream_name,
)

BATCH_JOB: Aggregate[JobState, JobCommand, JobEvent] = Aggregate(
    name="batch_job",
    initial_state=batch_job.initial_state,
    evolve=batch_job.evolve,
    decide=batch_job.decide,
    codec=EventCodec(
        "batch_job",
        events_of(JobEvent),
        correlation_fields=("scheduling", "job", "name"),
    ),
    stream_of=batch_job.stream_name,
)

SCHEDULING: Aggregate[SchedulingState, SchedulingCommand, SchedulingEvent] = Aggregate(
    name="scheduling",
    initial_state=scheduling.initial_state,
    evolve=scheduling.evolve,
    decide=scheduling.decide,
    codec=EventCodec(
        "scheduling",
        events_of(SchedulingEvent),
        correlation_fields=("name",),
    ),
    stream_of=scheduling.stream_name,
)
