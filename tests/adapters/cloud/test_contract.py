"""The ``CloudMachines`` contract, run against every adapter (see ``conftest.harness``).

FakeCloud, AksMachinesCloud and AzureVmCloud (the last two through their real SDKs and the fake
ARM server) must pass the very same tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fleetledger.adapters.cloud import (
    CapacityUnavailable,
    ProgressNote,
    QuotaExceeded,
    Throttled,
)

from .support import Harness, batch, outcomes


class Crash(Exception):
    """Stands for the controller dying right after it recorded a progress note."""


class TestCreateBatch:
    def test_creates_every_machine_of_the_batch(self, harness: Harness) -> None:
        """A healthy batch reports every machine created, each with its own provider id."""
        result = harness.cloud.create_batch(batch("m-1", "m-2", "m-3", zones=("1", "2", "3")))

        assert set(result.created) == {"m-1", "m-2", "m-3"}
        assert result.failed == {}
        assert len(set(result.created.values())) == 3

    def test_notes_progress_for_every_accepted_machine(self, harness: Harness) -> None:
        """Each accepted machine gets one progress note with a resume token."""
        notes: list[ProgressNote] = []

        harness.cloud.create_batch(batch("m-1", "m-2"), on_progress=notes.extend)

        assert sorted(n.machine_name for n in notes) == ["m-1", "m-2"]
        assert all(n.resume_token for n in notes)


class TestFailures:
    def test_exhausted_quota_fails_every_machine_with_quota_exceeded(
        self, harness: Harness
    ) -> None:
        """No quota left: every machine's outcome is QuotaExceeded, and none is created."""
        harness.exhaust_quota()

        seen = outcomes(harness.cloud, batch("m-1", "m-2"))

        assert all(isinstance(o, QuotaExceeded) for o in seen.values()), seen
        assert harness.creations() == ()

    def test_capacity_failure_fails_that_machine_with_its_zone(self, harness: Harness) -> None:
        """ZonalAllocationFailed fails only its machine, as CapacityUnavailable in its zone."""
        harness.fail_capacity("m-2", zone="2")

        result = harness.cloud.create_batch(batch("m-1", "m-2", zones=("1", "2")))

        assert set(result.created) == {"m-1"}
        error = result.failed["m-2"]
        assert isinstance(error, CapacityUnavailable)
        assert error.zone == "2"
        assert not error.retryable

    def test_throttling_surfaces_as_throttled_with_retry_after(self, harness: Harness) -> None:
        """A 429 reaches the caller as Throttled carrying the provider's Retry-After."""
        harness.throttle(retry_after=7)

        seen = outcomes(harness.cloud, batch("m-1"))

        error = seen["m-1"]
        assert isinstance(error, Throttled)
        assert error.retry_after == 7
        assert error.retryable

    def test_partial_failure_leaves_unreported_machines_unknown(self, harness: Harness) -> None:
        """A machine the provider says nothing about is neither created nor failed."""
        harness.fail_capacity("m-2", zone="2")
        harness.lose_result("m-3")
        request = batch("m-1", "m-2", "m-3", zones=("1", "2", "3"))

        result = harness.cloud.create_batch(request)

        assert set(result.created) == {"m-1"}
        assert set(result.failed) == {"m-2"}
        assert result.unknown(request) == ("m-3",)

    def test_an_unknown_machine_is_found_by_reading_it(self, harness: Harness) -> None:
        """Reading resolves an unknown outcome: the unreported machine does exist."""
        harness.lose_result("m-1")
        harness.cloud.create_batch(batch("m-1"))

        seen = harness.cloud.read_machine("m-1")

        assert seen.status == "succeeded"
        assert seen.provider_id


class TestCreateOnly:
    def test_recreating_a_machine_reports_it_without_making_a_second(
        self, harness: Harness
    ) -> None:
        """A repeated create of the same name returns the existing machine; one exists."""
        first = harness.cloud.create_batch(batch("m-1", batch_id="batch-1"))

        again = harness.cloud.create_batch(batch("m-1", batch_id="batch-2"))

        assert again.created == first.created
        assert harness.creations() == ("m-1",)

    def test_recreating_a_failed_machine_reports_its_failure_again(self, harness: Harness) -> None:
        """A name whose allocation failed stays failed; a retry never makes a second machine."""
        harness.fail_capacity("m-1", zone="1")
        harness.cloud.create_batch(batch("m-1", zones=("1",)))

        again = harness.cloud.create_batch(batch("m-1", batch_id="batch-2", zones=("1",)))

        assert isinstance(again.failed["m-1"], CapacityUnavailable)
        assert harness.creations() == ("m-1",)


class TestReadMachine:
    def test_reads_a_created_machine(self, harness: Harness) -> None:
        """A created machine reads as succeeded with the id the create reported."""
        created = harness.cloud.create_batch(batch("m-1")).created

        seen = harness.cloud.read_machine("m-1")

        assert seen.status == "succeeded"
        assert seen.provider_id == created["m-1"]

    def test_reads_a_missing_machine_as_not_found(self, harness: Harness) -> None:
        """A name never created reads as not_found."""
        seen = harness.cloud.read_machine("never-made")

        assert seen.status == "not_found"
        assert seen.provider_id is None

    def test_reads_a_failed_machine_with_its_classified_error(self, harness: Harness) -> None:
        """A machine whose allocation failed reads as failed, with CapacityUnavailable."""
        harness.fail_capacity("m-1", zone="3")
        harness.cloud.create_batch(batch("m-1", zones=("3",)))

        seen = harness.cloud.read_machine("m-1")

        assert seen.status == "failed"
        assert isinstance(seen.error, CapacityUnavailable)
        assert seen.error.zone == "3"

    def test_resume_token_finishes_an_interrupted_create(self, harness: Harness) -> None:
        """After a crash right after a progress note, the token resumes the create: no re-PUT."""
        notes: list[ProgressNote] = []

        def record_then_crash(accepted: Sequence[ProgressNote]) -> None:
            notes.extend(accepted)
            raise Crash

        with pytest.raises(Crash):
            harness.cloud.create_batch(batch("m-1"), on_progress=record_then_crash)
        seen = harness.cloud.read_machine("m-1", resume_token=notes[0].resume_token)

        assert seen.status == "succeeded"
        assert harness.creations() == ("m-1",)
