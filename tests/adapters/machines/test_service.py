"""The grouper's application service: decide, append with an expected version, idempotency."""

from __future__ import annotations

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.machines import (
    InvalidRequest,
    MachineService,
    RequestRejected,
    UnknownRequest,
    batch_stream_id,
    grouper_stream_id,
    skip_batching,
)
from fleetledger.eventstore import EventStore

from .support import CONFIG, EPOCH, events_of, request

STREAM = grouper_stream_id("default")


def service(store: EventStore, clock: ManualClock | None = None) -> MachineService:
    return MachineService(store, clock=clock or ManualClock(EPOCH), config=CONFIG)


class TestRequest:
    def test_appends_the_request_with_its_metadata(self, sqlite_store: EventStore) -> None:
        """One request is one MachineRequested event, correlated to its request id."""
        accepted = service(sqlite_store).request([request(1)])

        (event,) = sqlite_store.read_stream(STREAM)
        assert accepted.request_ids == ("r-1",)
        assert event.type == "vm.MachineRequested"
        assert event.metadata == {
            "correlation_id": "r-1",
            "causation_id": "r-1",
            "actor": "fleetledger",
            "grouper": "default",
        }

    def test_a_service_picks_a_request_id_when_none_is_given(
        self, sqlite_store: EventStore
    ) -> None:
        """Callers that do not care about idempotency get a fresh id back."""
        from dataclasses import replace

        accepted = service(sqlite_store).request([replace(request(1), request_id=None)])

        assert len(accepted.request_ids[0]) == 32

    def test_sealing_opens_the_batch_stream_in_the_same_append(self, store: EventStore) -> None:
        """A skip-batching request seals its batch and opens the batch's stream atomically."""
        svc = service(store)
        accepted = svc.request([request(1, skip_batching=True)])

        (batch_id,) = accepted.sealed_batch_ids
        sealed = store.read_stream(STREAM)[-1]
        (opened,) = store.read_stream(batch_stream_id("default", batch_id))
        assert [e.type for e in store.read_stream(STREAM)] == [
            "vm.MachineRequested",
            "vm.BatchSealed",
        ]
        assert opened.type == "vm.BatchOpened"
        assert opened.metadata["causation_id"] == str(sealed.event_id)
        # One transaction: one contiguous run of positions, one commit time.
        together = [*store.read_stream(STREAM), opened]
        assert sorted(e.global_position for e in together) == [1, 2, 3]
        assert len({e.recorded_at for e in together}) == 1

    def test_the_skip_batching_context_applies_to_requests_without_a_flag(
        self, sqlite_store: EventStore
    ) -> None:
        """``with skip_batching():`` is the seed's WithSkipBatching(ctx)."""
        svc = service(sqlite_store)
        with skip_batching():
            flagged = svc.request([request(1)])
            overridden = svc.request([request(2, skip_batching=False)])

        assert len(flagged.sealed_batch_ids) == 1
        assert overridden.sealed_batch_ids == ()

    def test_repeating_a_request_appends_nothing(self, sqlite_store: EventStore) -> None:
        """The same request id with the same content is accepted again without a new event."""
        svc = service(sqlite_store)
        svc.request([request(1)])
        again = svc.request([request(1)])

        assert again.last_position is None
        assert sqlite_store.stream_version(STREAM) == 1

    def test_a_refused_request_appends_nothing_of_the_call(self, sqlite_store: EventStore) -> None:
        """Requests of one call are all appended or none: a taken name refuses the whole call."""
        svc = service(sqlite_store)
        svc.request([request(1)])
        taken = request(2)
        from dataclasses import replace

        with pytest.raises(RequestRejected) as refused:
            svc.request([request(3), replace(taken, machine_name="m-1")])

        assert refused.value.index == 1
        assert "m-1" in refused.value.reason
        assert sqlite_store.stream_version(STREAM) == 1

    def test_a_malformed_request_names_the_field(self, sqlite_store: EventStore) -> None:
        """A zone listed twice is refused as invalid, naming ``zones``."""
        with pytest.raises(InvalidRequest) as invalid:
            service(sqlite_store).request([request(1, zones=("1", "1"))])

        assert invalid.value.field == "zones"
        assert sqlite_store.stream_version(STREAM) == 0

    def test_a_stale_service_catches_up_and_decides_again(self, store: EventStore) -> None:
        """Two writers on one grouper stream: the second reloads on a version conflict."""
        first, second = service(store), service(store)
        first.load()
        second.load()

        first.request([request(1)])
        second.request([request(2)])

        assert store.stream_version(STREAM) == 2
        assert second.status("r-1") is not None
        assert second.version == 2

    def test_a_taken_name_is_refused_even_when_learnt_while_catching_up(
        self, sqlite_store: EventStore
    ) -> None:
        """Deciding again after a conflict sees the other writer's requests."""
        first, second = service(sqlite_store), service(sqlite_store)
        first.load()
        second.load()
        first.request([request(1)])
        from dataclasses import replace

        with pytest.raises(RequestRejected):
            second.request([replace(request(2), machine_name="m-1")])


class TestTicks:
    def test_tick_seals_only_batches_whose_deadline_passed(self, sqlite_store: EventStore) -> None:
        """Before the idle deadline a tick appends nothing; at it, the batch is sealed."""
        clock = ManualClock(EPOCH)
        svc = service(sqlite_store, clock)
        svc.request([request(1)])

        early = svc.tick()
        clock.advance(CONFIG.idle_timeout)
        due = svc.tick()

        assert early == ()
        assert len(due) == 1
        assert svc.next_deadline() is None

    def test_shutdown_seals_everything_pending(self, sqlite_store: EventStore) -> None:
        """A graceful stop leaves no request pending."""
        svc = service(sqlite_store)
        svc.request([request(1), request(2, zones=("2",))])

        sealed = svc.shutdown()

        assert len(sealed) == 1
        assert [e.type for e in sqlite_store.read_stream(STREAM)][-1] == "vm.BatchSealed"
        assert sqlite_store.read_stream(STREAM)[-1].data["reason"] == "shutdown"


class TestOutcomeFuture:
    def test_unknown_request_ids_are_refused(self, sqlite_store: EventStore) -> None:
        """Asking for a request never accepted is an error, not a future that never ends."""
        with pytest.raises(UnknownRequest, match="r-404"):
            service(sqlite_store).outcome_future("r-404")

    def test_a_pending_request_has_a_pending_future(self, sqlite_store: EventStore) -> None:
        """The future is resolved later, by the batch's outcomes."""
        svc = service(sqlite_store)
        svc.request([request(1)])

        assert not svc.outcome_future("r-1").done()


class TestUnfinishedBatches:
    def test_lists_sealed_batches_without_outcomes(self, sqlite_store: EventStore) -> None:
        """What a restart must resume: sealed, not reported complete."""
        svc = service(sqlite_store)
        accepted = svc.request([request(1, skip_batching=True), request(2)])

        assert svc.unfinished_batches() == accepted.sealed_batch_ids
        assert events_of(
            sqlite_store, batch_stream_id("default", accepted.sealed_batch_ids[0])
        ) == ["vm.BatchOpened"]
