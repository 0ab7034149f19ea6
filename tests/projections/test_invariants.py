"""The log's invariants, replayed from position 0: clean logs pass, each breach is found at the
position of the event that broke it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleetledger.adapters.simulator.dst import run_seed
from fleetledger.domain.codec import to_data
from fleetledger.domain.nodes import (
    ResourcesGranted,
)
from fleetledger.domain.testbeds import testbed
from fleetledger.eventstore import EventStore, NewEvent, open_store
from fleetledger.projections.invariants import InvariantChecks, first_breach
from tests.node_events import node_with_a_pod

AT = datetime(2025, 1, 1, tzinfo=UTC)
GROUPER = {"grouper": "g"}


def raw(type_name: str, data: Mapping[str, Any], **metadata: object) -> NewEvent:
    return NewEvent(type_name, data, metadata={**GROUPER, **metadata})


def domain(event: object) -> NewEvent:
    type_name, version, data = to_data(event)
    return NewEvent(type_name, data, schema_version=version)


def request_lifecycle(request: str = "r1", batch: str = "b1") -> Iterator[tuple[str, NewEvent]]:
    """A request's events, stream by stream, as a grouper and its batch record them."""
    ids = {"request_id": request, "batch_id": batch, "machine_name": f"m-{request}"}
    grouper, batch_stream = "vmgrouper-g", f"vmbatch-g-{batch}"
    yield grouper, raw("vm.MachineRequested", ids)
    yield grouper, raw("vm.BatchSealed", {"batch_id": batch, "request_ids": [request]})
    yield batch_stream, raw("vm.BatchOpened", {"batch_id": batch})
    yield batch_stream, raw("vm.BatchDispatched", {"batch_id": batch, "request_ids": [request]})
    yield batch_stream, raw("vm.MachineCreateAccepted", ids)
    yield batch_stream, raw("vm.MachineCreated", ids)
    outcomes = {"batch_id": batch, "created_request_ids": [request], "failed_request_ids": []}
    yield batch_stream, raw("vm.BatchCompleted", outcomes)
    yield grouper, raw("vm.BatchOutcomesRecorded", outcomes)


def append(store: EventStore, events: Iterable[tuple[str, NewEvent]]) -> None:
    for stream, event in events:
        store.append(stream, [event])


def slot(pod: str, position: int = 0) -> NewEvent:
    return domain(testbed.SlotReserved(0, "n1", position, pod, f"uid-{pod}", None, None, AT))


def workload(kind: str, workload_id: str = "w1") -> NewEvent:
    if kind == "Submitted":
        return raw("placement.WorkloadSubmitted", {"request": {"id": workload_id}})
    return raw(f"placement.Workload{kind}", {"workload_id": workload_id})


class TestCleanLogs:
    def test_a_request_through_its_whole_lifecycle_passes(self, sqlite_store: EventStore) -> None:
        """Requested, sealed, opened, dispatched, accepted, created, completed, recorded."""
        append(sqlite_store, request_lifecycle())
        assert first_breach(sqlite_store) == (None, 8)

    def test_a_seed_of_the_simulation_passes(self, tmp_path: Path) -> None:
        """Every capability's runtime under faults (DST seed 3: placement overflow, a failed
        machine, a leader change) writes a log that keeps every invariant."""
        url = f"sqlite:///{tmp_path / 'seed.db'}"
        assert run_seed(3, url=url).ok
        with open_store(url) as store:
            breach, checked = first_breach(store)
            assert breach is None and checked == store.head()

    def test_a_workload_placed_released_and_submitted_again_passes(
        self, sqlite_store: EventStore
    ) -> None:
        kinds = ("Submitted", "Waiting", "Placed", "Released", "Submitted", "Rejected")
        append(sqlite_store, [("workload-w1", workload(kind)) for kind in kinds])
        assert first_breach(sqlite_store)[0] is None


class TestOneOutcome:
    def test_a_second_outcome_is_caught_at_its_position(self, store: EventStore) -> None:
        append(store, request_lifecycle())
        ids = {"request_id": "r1", "batch_id": "b1", "machine_name": "m-r1"}
        position = store.append("vmbatch-g-b2", [raw("vm.MachineFailed", ids)]).last_position

        breach, _ = first_breach(store)

        assert breach is not None
        assert (breach.position, breach.invariant) == (position, "one_outcome")
        assert "r1 was created already: now failed" in breach.detail

    def test_an_outcome_without_a_request_is_caught(self, sqlite_store: EventStore) -> None:
        ids = {"request_id": "ghost", "batch_id": "b1", "machine_name": "m"}
        sqlite_store.append("vmbatch-g-b1", [raw("vm.BatchOpened", {"batch_id": "b1"})])
        sqlite_store.append("vmbatch-g-b1", [raw("vm.MachineCreated", ids)])
        breach, _ = first_breach(sqlite_store)
        assert breach is not None and (breach.position, breach.invariant) == (2, "one_outcome")

    def test_an_outcome_recorded_twice_by_the_grouper_is_caught(
        self, sqlite_store: EventStore
    ) -> None:
        append(sqlite_store, request_lifecycle())
        again = {"batch_id": "b1", "created_request_ids": ["r1"], "failed_request_ids": []}
        sqlite_store.append("vmgrouper-g", [raw("vm.BatchOutcomesRecorded", again)])
        breach, _ = first_breach(sqlite_store)
        assert breach is not None and (breach.position, breach.invariant) == (9, "one_outcome")

    def test_the_same_ids_in_another_grouper_are_another_request(
        self, sqlite_store: EventStore
    ) -> None:
        """Request and batch ids are a grouper's own: two groupers may both use ``r1``."""
        append(sqlite_store, request_lifecycle())
        other = [(s, replace(e, metadata={"grouper": "h"})) for s, e in request_lifecycle()]
        append(sqlite_store, [(s.replace("-g", "-h"), e) for s, e in other])
        assert first_breach(sqlite_store)[0] is None

    def test_a_workload_placed_twice_is_caught(self, sqlite_store: EventStore) -> None:
        kinds = ("Submitted", "Placed", "Placed")
        append(sqlite_store, [("workload-w1", workload(kind)) for kind in kinds])
        breach, _ = first_breach(sqlite_store)
        assert breach is not None and (breach.position, breach.invariant) == (3, "one_outcome")


class TestGrants:
    def test_grants_the_domain_decides_pass(self, sqlite_store: EventStore) -> None:
        sqlite_store.append("node-n", [domain(e) for e in node_with_a_pod()])
        assert first_breach(sqlite_store)[0] is None

    def test_a_grant_beyond_total_minus_system_is_caught(self, store: EventStore) -> None:
        events = node_with_a_pod()
        granted = next(e for e in events if isinstance(e, ResourcesGranted))
        forged = replace(granted, cpu_requested_milli=4000, cpu_milli=4000)
        store.append("node-n", [domain(e) for e in events])
        position = store.append("node-n", [domain(forged)]).last_position

        breach, _ = first_breach(store)

        assert breach is not None
        assert (breach.position, breach.invariant) == (position, "grant_beyond_capacity")
        assert "4000 reserved of 3000 reservable" in breach.detail


class TestSlots:
    def test_a_slot_reserved_for_a_second_pod_is_caught(self, store: EventStore) -> None:
        store.append("testbed-bed", [slot("a"), slot("b", 1), slot("b")])
        breach, _ = first_breach(store)
        assert breach is not None and (breach.position, breach.invariant) == (3, "slot_held_twice")
        assert "reserved for b while a held it" in breach.detail

    def test_a_slot_reserved_again_after_it_was_cleared_passes(
        self, sqlite_store: EventStore
    ) -> None:
        cleared = domain(testbed.ReservationCleared(0, "n1", 0, "a", "released", AT))
        sqlite_store.append("testbed-bed", [slot("a"), cleared, slot("b"), slot("b")])
        assert first_breach(sqlite_store)[0] is None

    def test_slots_of_two_testbeds_are_apart(self, sqlite_store: EventStore) -> None:
        sqlite_store.append("testbed-one", [slot("a")])
        sqlite_store.append("testbed-two", [slot("b")])
        assert first_breach(sqlite_store)[0] is None


class TestTransitions:
    def test_a_workload_placed_before_it_was_submitted_is_caught(
        self, sqlite_store: EventStore
    ) -> None:
        sqlite_store.append("workload-w1", [workload("Placed")])
        breach, _ = first_breach(sqlite_store)
        assert breach is not None and breach.invariant == "illegal_transition"
        assert "w1 is new: it cannot be placed" in breach.detail

    def test_a_batch_recording_after_it_completed_is_caught(self, sqlite_store: EventStore) -> None:
        append(sqlite_store, request_lifecycle())
        late = raw(
            "vm.BatchCompleted",
            {"batch_id": "b1", "created_request_ids": [], "failed_request_ids": []},
        )
        sqlite_store.append("vmbatch-g-b1", [late])
        breach, _ = first_breach(sqlite_store)
        assert breach is not None and (breach.position, breach.invariant) == (
            9,
            "illegal_transition",
        )
        assert "after it completed" in breach.detail

    def test_a_request_dispatched_before_it_was_sealed_is_caught(
        self, sqlite_store: EventStore
    ) -> None:
        ids = {"request_id": "r1", "batch_id": "b1", "machine_name": "m"}
        sqlite_store.append("vmgrouper-g", [raw("vm.MachineRequested", ids)])
        sqlite_store.append("vmbatch-g-b1", [raw("vm.BatchOpened", {"batch_id": "b1"})])
        sqlite_store.append(
            "vmbatch-g-b1", [raw("vm.BatchDispatched", {"batch_id": "b1", "request_ids": ["r1"]})]
        )
        breach, _ = first_breach(sqlite_store)
        assert breach is not None and breach.position == 3
        assert "r1 is requested: it cannot be dispatched" in breach.detail

    def test_a_record_missing_its_fields_is_a_breach_not_a_crash(
        self, sqlite_store: EventStore
    ) -> None:
        sqlite_store.append("vmgrouper-g", [raw("vm.BatchSealed", {"reason": "idle"})])
        breach, _ = first_breach(sqlite_store)
        assert breach is not None and breach.invariant == "illegal_transition"
        assert "does not decode" in breach.detail


class TestReplay:
    def test_the_first_breach_is_reported_and_until_stops_before_later_ones(
        self, sqlite_store: EventStore
    ) -> None:
        sqlite_store.append("workload-w1", [workload("Placed")])  # position 1
        sqlite_store.append("testbed-bed", [slot("a"), slot("b")])  # position 3
        breach, checked = first_breach(sqlite_store)
        assert breach is not None and (breach.position, checked) == (1, 1)
        checks = InvariantChecks()
        found = list(checks.check_all(sqlite_store.read_all(after=1)))
        assert [b.position for b in found] == [3]

    def test_until_leaves_out_the_events_after_it(self, sqlite_store: EventStore) -> None:
        append(sqlite_store, request_lifecycle())
        sqlite_store.append("workload-w1", [workload("Placed")])
        progress: list[int] = []
        assert first_breach(sqlite_store, until=8, progress=progress.append) == (None, 8)
        assert progress == [8]  # each page's last event checked


@pytest.mark.parametrize("kind", ["Waiting", "Rejected"])
def test_a_placed_workload_cannot_wait_or_be_rejected(kind: str, sqlite_store: EventStore) -> None:
    """Placement records nothing but a release on a placed workload."""
    append(sqlite_store, [("workload-w1", workload(k)) for k in ("Submitted", "Placed", kind)])
    breach, _ = first_breach(sqlite_store)
    assert breach is not None and (breach.position, breach.invariant) == (3, "illegal_transition")
