"""Causes come before their effects in the global log of a whole simulated run."""

from __future__ import annotations

import contextlib

from fleetledger.adapters.simulator import run_scenario
from fleetledger.eventstore import RecordedEvent, open_store


def _events(url: str) -> list[RecordedEvent]:
    with contextlib.closing(open_store(url)) as store:
        return store.read_all(after=0, limit=1_000_000)


class TestCausesBeforeEffects:
    def test_no_causation_points_forward(self, store_url: str) -> None:
        """Every event whose cause is an event of the log comes after that event."""
        run_scenario("burst-vms", seed=1, url=store_url)
        events = _events(store_url)
        position = {str(e.event_id): e.global_position for e in events}

        forward = [
            (e.global_position, e.type, e.metadata["causation_id"])
            for e in events
            if position.get(str(e.metadata.get("causation_id")), 0) > e.global_position
        ]

        assert sum(str(e.metadata.get("causation_id")) in position for e in events) > 100
        assert forward == []

    def test_no_correlation_points_forward(self, store_url: str) -> None:
        """An event about a request or a batch comes after the event that opened it: the
        request's MachineRequested, the batch's BatchSealed."""
        run_scenario("burst-vms", seed=1, url=store_url)
        events = _events(store_url)
        origin: dict[str, int] = {}
        for e in events:
            if e.type == "vm.MachineRequested":
                origin[str(e.data["request_id"])] = e.global_position
            elif e.type == "vm.BatchSealed":
                origin[str(e.data["batch_id"])] = e.global_position

        forward = [
            (e.global_position, e.type, e.metadata["correlation_id"])
            for e in events
            if origin.get(str(e.metadata.get("correlation_id")), 0) > e.global_position
        ]

        assert {e.type for e in events} >= {"vm.BatchOpened", "vm.MachineCreated"}
        assert forward == []
