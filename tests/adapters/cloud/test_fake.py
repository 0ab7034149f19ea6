"""FakeCloud specifics beyond the contract: latency on a clock, scripts, recording, threads."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import (
    FakeCloud,
    ProgressNote,
    QuotaExceeded,
    Throttled,
    UnknownCloudError,
    batch_put_machine_header,
)
from fleetledger.adapters.cloud.throttling import ARM_SUBSCRIPTION_WRITES, BucketLimits

from .support import EPOCH, batch


class TestLatency:
    def test_latency_passes_on_the_clock_not_in_real_time(self) -> None:
        """A create takes ``latency`` seconds of ManualClock time, and nothing more."""
        clock = ManualClock(EPOCH)
        cloud = FakeCloud(clock=clock, latency=90.0)

        cloud.create_batch(batch("m-1", "m-2"))

        assert clock.now() == EPOCH + timedelta(seconds=90)

    def test_a_machine_reads_as_creating_until_its_latency_has_passed(self) -> None:
        """Between acceptance and readiness a read says creating."""
        clock = ManualClock(EPOCH)
        cloud = FakeCloud(clock=clock, latency=90.0)

        def crash(notes: Sequence[ProgressNote]) -> None:
            raise RuntimeError("controller died")

        with pytest.raises(RuntimeError):
            cloud.create_batch(batch("m-1"), on_progress=crash)

        assert cloud.read_machine("m-1").status == "creating"
        clock.advance(90)
        assert cloud.read_machine("m-1").status == "succeeded"

    def test_varied_latency_is_drawn_per_call_within_its_range(self) -> None:
        """Each call's machines take one draw from the range (a batch's operation), and the
        same seed gives the same draws."""

        def latencies(seed: int) -> list[float]:
            clock = ManualClock(EPOCH)
            cloud = FakeCloud(clock=clock, latency=1.0)
            cloud.vary_latency(60, 120, seed=seed)
            taken = []
            for n in range(5):
                before = clock.now()
                cloud.create_batch(batch(f"m-{n}-a", f"m-{n}-b"))
                taken.append((clock.now() - before).total_seconds())
            return taken

        first = latencies(7)

        assert all(60 <= t <= 120 for t in first)
        assert len(set(first)) == 5
        assert latencies(7) == first
        assert latencies(8) != first

    def test_a_latency_range_must_be_ordered(self) -> None:
        with pytest.raises(ValueError, match="low <= high"):
            FakeCloud().vary_latency(120, 60, seed=1)


class TestWriteBudget:
    def test_calls_beyond_the_bucket_are_refused_with_a_whole_second_retry_after(self) -> None:
        """Two writes in the bucket, one a second: the third call at once is refused as ARM
        refuses it (429, Retry-After in whole seconds) and creates nothing."""
        clock = ManualClock(EPOCH)
        cloud = FakeCloud(clock=clock)
        cloud.limit_writes(BucketLimits(2, 1.0))
        cloud.create_batch(batch("m-1"))
        cloud.create_batch(batch("m-2"))

        with pytest.raises(Throttled) as refused:
            cloud.create_batch(batch("m-3"))

        assert refused.value.retry_after == 1.0
        assert refused.value.provider_code == "SubscriptionRequestsThrottled"
        assert cloud.creations == ("m-1", "m-2")
        assert cloud.write_refusals == 1
        clock.advance(1)
        assert set(cloud.create_batch(batch("m-3")).created) == {"m-3"}

    def test_a_call_costs_one_write_per_machines_per_write(self) -> None:
        """120 machines at 50 a write cost 3 writes: a bucket of 4 takes one such call, and
        refuses the next."""
        cloud = FakeCloud(clock=ManualClock(EPOCH))
        cloud.limit_writes(BucketLimits(4, 1.0), machines_per_write=50)

        cloud.create_batch(batch(*(f"a-{n}" for n in range(120))))

        with pytest.raises(Throttled):
            cloud.create_batch(batch(*(f"b-{n}" for n in range(120))))

    def test_the_bucket_may_start_part_spent(self) -> None:
        """Other writers share the subscription's budget: the fake may start with less."""
        cloud = FakeCloud(clock=ManualClock(EPOCH))
        cloud.limit_writes(ARM_SUBSCRIPTION_WRITES, available=1)
        cloud.create_batch(batch("m-1"))

        with pytest.raises(Throttled) as refused:
            cloud.create_batch(batch("m-2"))

        assert refused.value.retry_after == 1.0  # a token at 10 a second, rounded up


class TestScripts:
    def test_a_failed_call_raises_and_creates_nothing(self) -> None:
        """fail_next_calls refuses whole calls, once per count."""
        cloud = FakeCloud()
        cloud.fail_next_calls(UnknownCloudError("ARM is down", retryable=True))

        with pytest.raises(UnknownCloudError):
            cloud.create_batch(batch("m-1"))
        result = cloud.create_batch(batch("m-1"))

        assert set(result.created) == {"m-1"}
        assert cloud.creations == ("m-1",)

    def test_a_refusal_leaves_the_name_free_for_a_retry(self) -> None:
        """A refused machine (quota) leaves nothing behind, so the same name can succeed later."""
        cloud = FakeCloud()
        cloud.fail_machine("m-1", QuotaExceeded("no cores"))

        refused = cloud.create_batch(batch("m-1"))
        retried = cloud.create_batch(batch("m-1", batch_id="batch-2"))

        assert isinstance(refused.failed["m-1"], QuotaExceeded)
        assert set(retried.created) == {"m-1"}

    def test_quota_counts_only_live_machines(self) -> None:
        """Machines beyond the quota are refused; the ones that fit are created."""
        cloud = FakeCloud(quota=2)

        result = cloud.create_batch(batch("m-1", "m-2", "m-3"))

        assert set(result.created) == {"m-1", "m-2"}
        assert isinstance(result.failed["m-3"], QuotaExceeded)


class TestFailedLeftovers:
    def test_failed_machines_stay_as_leftovers_by_default(self) -> None:
        """Without delete_failed a provisioning failure leaves a failed machine behind."""
        cloud = FakeCloud()
        cloud.fail_machine("m-1", UnknownCloudError("disk attach failed"))

        result = cloud.create_batch(batch("m-1", "m-2"))

        assert result.deleted == ()
        assert cloud.failed_leftovers() == ("m-1",)
        assert cloud.machine_names() == ("m-1", "m-2")

    def test_delete_failed_removes_and_reports_them(self) -> None:
        """With delete_failed the failed machine is deleted, reported, and counted apart."""
        cloud = FakeCloud(delete_failed=True)
        cloud.fail_machine("m-1", UnknownCloudError("disk attach failed"))

        result = cloud.create_batch(batch("m-1", "m-2"))

        assert result.deleted == ("m-1",)
        assert set(result.failed) == {"m-1"}
        assert (cloud.deletions, cloud.failed_leftovers()) == (("m-1",), ())
        assert cloud.machine_names() == ("m-2",)
        assert cloud.creations == ("m-1", "m-2")

    def test_a_refusal_is_nothing_to_delete(self) -> None:
        """A refused machine never existed, so nothing is deleted."""
        cloud = FakeCloud(delete_failed=True)
        cloud.fail_machine("m-1", QuotaExceeded("no cores"))

        result = cloud.create_batch(batch("m-1"))

        assert (result.deleted, cloud.deletions) == ((), ())

    def test_a_failed_machine_found_by_a_read_is_deleted(self) -> None:
        """With delete_failed a read that finds a failed machine deletes it and says so."""
        cloud = FakeCloud(delete_failed=True)
        cloud.fail_machine("m-1", UnknownCloudError("disk attach failed"))
        cloud.omit_from_result("m-1")
        cloud.create_batch(batch("m-1"))

        seen = cloud.read_machine("m-1")

        assert (seen.status, seen.deleted) == ("failed", True)
        assert (cloud.deletions, cloud.machine_names()) == (("m-1",), ())

    def test_a_read_deletes_nothing_by_default(self) -> None:
        """Without delete_failed a read leaves the failed machine in place."""
        cloud = FakeCloud()
        cloud.fail_machine("m-1", UnknownCloudError("disk attach failed"))
        cloud.create_batch(batch("m-1"))

        seen = cloud.read_machine("m-1")

        assert (seen.status, seen.deleted) == ("failed", False)
        assert cloud.failed_leftovers() == ("m-1",)


class TestRecording:
    def test_records_each_call_with_its_batch_put_machine_header(self) -> None:
        """Tests can assert one call per batch and the exact header it would have carried."""
        cloud = FakeCloud()
        request = batch("m-1", "m-2", zones=("1", "2"))

        cloud.create_batch(request)

        (call,) = cloud.calls
        assert call.request == request
        assert call.header == batch_put_machine_header(request.machines)


class TestThreadSafety:
    def test_concurrent_creates_of_one_name_make_one_machine(self) -> None:
        """Eight threads creating the same name at once yield one machine and one id."""
        cloud = FakeCloud()
        start = threading.Barrier(8)
        ids: list[str] = []
        lock = threading.Lock()

        def create(i: int) -> None:
            start.wait()
            result = cloud.create_batch(batch("m-1", batch_id=f"batch-{i}"))
            with lock:
                ids.extend(result.created.values())

        threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        assert cloud.creations == ("m-1",)
        assert len(ids) == 8
        assert len(set(ids)) == 1
