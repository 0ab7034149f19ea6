"""The causal chain of an id: a machine made through placement overflow, from the workload that
overflowed to the node it joined as; a request apart from its batch's others; testbed pods."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from fleetledger.adapters.simulator.dst import run_seed
from fleetledger.eventstore import EventStore, NewEvent, open_store
from fleetledger.projections.explain import ID_KINDS, Explanation, UnknownId, explain

OVERFLOW_CHAIN = (
    "placement.WorkloadSubmitted",
    "placement.WorkloadWaiting",
    "vm.MachineRequested",
    "vm.BatchSealed",
    "vm.BatchDispatched",
    "vm.MachineCreated",
    "nodes.NodeJoined",
    "placement.WorkloadPlaced",
)
"""Workload → overflow → machine request → batch → cloud call → created → placed."""


@pytest.fixture(scope="module")
def seed_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventStore]:
    """DST seed 3's log: placement overflows onto a worker it asks the Grouper for."""
    url = f"sqlite:///{tmp_path_factory.mktemp('explain') / 'seed3.db'}"
    assert run_seed(3, url=url).ok
    with open_store(url) as store:
        yield store


def overflow(store: EventStore) -> tuple[str, str]:
    """The first workload that waited for a new worker, and that worker's name."""
    waiting = store.read_all(after=0, types=["placement.WorkloadWaiting"], limit=1)[0]
    return waiting.data["workload_id"], waiting.data["worker"]


def types_in_order(explanation: Explanation, wanted: tuple[str, ...]) -> list[str]:
    """The first step of each ``wanted`` type, in the order the chain has them."""
    firsts: dict[str, int] = {}
    for step in explanation.steps:
        firsts.setdefault(step.type, step.position)
    return sorted((t for t in wanted if t in firsts), key=lambda t: firsts[t])


class TestPlacementOverflow:
    def test_the_machine_shows_workload_overflow_request_batch_call_created_placed(
        self, seed_log: EventStore
    ) -> None:
        workload, worker = overflow(seed_log)

        chain = explain(seed_log, worker)

        assert types_in_order(chain, OVERFLOW_CHAIN) == list(OVERFLOW_CHAIN)
        requested = next(s for s in chain.steps if s.type == "vm.MachineRequested")
        assert requested.fields["request_id"] == f"placement-{worker}"
        placed = next(s for s in chain.steps if s.type == "placement.WorkloadPlaced")
        assert placed.fields == {"workload_id": workload, "node": worker}
        assert "machine or node" in chain.kinds

    def test_the_workload_the_request_and_the_batch_tell_the_same_chain(
        self, seed_log: EventStore
    ) -> None:
        workload, worker = overflow(seed_log)
        by_machine = explain(seed_log, worker)
        requested = next(s for s in by_machine.steps if s.type == "vm.MachineRequested")

        for subject in (workload, f"placement-{worker}", str(requested.fields["batch_id"])):
            assert explain(seed_log, subject).steps == by_machine.steps, subject

    def test_each_step_names_the_event_its_causation_points_at(self, seed_log: EventStore) -> None:
        _, worker = overflow(seed_log)
        steps = {s.type: s for s in explain(seed_log, worker).steps}
        assert steps["vm.BatchOpened"].caused_by == steps["vm.BatchSealed"].position
        assert steps["vm.BatchDispatched"].caused_by == steps["vm.BatchOpened"].position
        assert steps["placement.WorkloadSubmitted"].caused_by is None  # a client's command


class TestBatches:
    def test_a_request_leaves_out_the_other_requests_of_its_batch(
        self, seed_log: EventStore
    ) -> None:
        """A request's chain shows its batch's seal and cloud call, not its siblings'
        outcomes; the batch's chain shows every request's."""
        sealed = next(
            r
            for r in seed_log.read_all(after=0, types=["vm.BatchSealed"])
            if len(r.data["request_ids"]) > 1
        )
        first, second = sealed.data["request_ids"][:2]

        mine = explain(seed_log, first)
        whole = explain(seed_log, sealed.data["batch_id"])

        assert sealed.global_position in {s.position for s in mine.steps}
        assert {s.fields.get("request_id") for s in mine.steps} == {first, None}
        assert {first, second} <= {s.fields.get("request_id") for s in whole.steps}
        assert whole.kinds == ("batch",)


class TestMachines:
    def test_a_machine_that_never_joined_shows_its_request_and_outcome(
        self, seed_log: EventStore
    ) -> None:
        """A client's machine is no node here: its name still leads to its request and batch."""
        created = next(
            r
            for r in seed_log.read_all(after=0, types=["vm.MachineCreated"])
            if not r.data["request_id"].startswith("placement-")
        )

        chain = explain(seed_log, created.data["machine_name"])

        assert types_in_order(
            chain, ("vm.MachineRequested", "vm.BatchSealed", "vm.MachineCreated")
        ) == [
            "vm.MachineRequested",
            "vm.BatchSealed",
            "vm.MachineCreated",
        ]
        assert {s.fields.get("request_id") for s in chain.steps} == {
            created.data["request_id"],
            None,
        }


class TestUnknownIds:
    def test_an_id_no_event_is_about_names_the_kinds_searched(self, seed_log: EventStore) -> None:
        with pytest.raises(UnknownId) as raised:
            explain(seed_log, "no-such-thing")
        message = str(raised.value)
        assert "'no-such-thing'" in message
        assert all(kind in message for kind in ID_KINDS)


def testbed_log(store: EventStore) -> None:
    """Scheduling s1 runs jobs j1 and j2 on testbed slots 0 and 1: pods p1 and p2."""

    def event(type_name: str, data: Mapping[str, Any]) -> list[NewEvent]:
        return [NewEvent(type_name, data)]

    store.append(
        "scheduling-s1", event("scheduling.SchedulingCreated", {"name": "s1", "testbed": "bed"})
    )
    for job, slot, pod in (("j1", 0, "p1"), ("j2", 1, "p2")):
        store.append(
            f"batch-job-{job}", event("batch_job.JobClaimed", {"job": job, "scheduling": "s1"})
        )
        request = {"testbed": "bed", "slot_ids": [slot]}
        store.append(
            f"batch-job-{job}",
            event(
                "batch_job.ApplicationRequested",
                {"job": job, "scheduling": "s1", "request": request},
            ),
        )
        reserved = {"slot_id": slot, "node": "n1", "position_on_node": slot, "pod_name": pod}
        store.append("testbed-bed", event("testbed.SlotReserved", reserved))


class TestTestbeds:
    def test_a_pod_goes_back_to_its_job_and_scheduling_not_to_its_siblings(
        self, sqlite_store: EventStore
    ) -> None:
        testbed_log(sqlite_store)

        chain = explain(sqlite_store, "p1")

        shown = [
            (s.type, s.fields.get("job") or s.fields.get("pod_name") or s.fields.get("name"))
            for s in chain.steps
        ]
        assert shown == [
            ("scheduling.SchedulingCreated", "s1"),
            ("batch_job.JobClaimed", "j1"),
            ("batch_job.ApplicationRequested", "j1"),
            ("testbed.SlotReserved", "p1"),
        ]

    def test_a_scheduling_reaches_every_job_and_pod(self, sqlite_store: EventStore) -> None:
        testbed_log(sqlite_store)
        pods = {s.fields.get("pod_name") for s in explain(sqlite_store, "s1").steps}
        assert {"p1", "p2"} <= pods


def test_steps_are_in_log_order(seed_log: EventStore) -> None:
    _, worker = overflow(seed_log)
    positions = [s.position for s in explain(seed_log, worker).steps]
    assert positions == sorted(set(positions))
