"""The vertical slice on SQLite and Postgres: requests → log → coordinator → cloud → outcomes.

The issue's acceptance cases: 5 requests of one template make 1 cloud call, 2 templates make 2,
120 requests with batches of at most 50 make 3 calls (50, 50, 20), and a crash between sealing
and the result leaves, after a restart, one outcome per request and no machine created twice.
"""

from __future__ import annotations

import contextlib

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.machines import Coordinator, InlineRunner, grouper_stream_id
from fleetledger.eventstore import open_store

from .support import (
    D4,
    D8,
    EPOCH,
    CrashingCloud,
    HeldRunner,
    SimulatedCrash,
    manual_runtime,
    pass_idle_timeout,
    request,
    terminal_outcomes,
)


class TestBatching:
    def test_five_requests_of_one_template_make_one_cloud_call(self, store_url: str) -> None:
        """Five requests sharing a template are created by one BatchPutMachine call."""
        clock = ManualClock(EPOCH)
        cloud = FakeCloud(clock=clock)
        with contextlib.closing(open_store(store_url)) as store:
            runtime = manual_runtime(store, cloud, clock)
            futures = runtime.machines.enqueue_many(
                [request(n, zones=(str(n % 3 + 1),), tags={"n": str(n)}) for n in range(5)]
            )
            pass_idle_timeout(runtime, clock)

            outcomes = [future.result(timeout=5) for future in futures]

        assert [o.status for o in outcomes] == ["created"] * 5
        assert len(cloud.calls) == 1
        assert cloud.calls[0].header == {
            "vmSkus": {"value": []},
            "batchMachines": [
                {
                    "machineName": f"m-{n}",
                    "zones": [str(n % 3 + 1)],
                    "tags": {"n": str(n), "fleetledger-request": f"r-{n}"},
                }
                for n in range(5)
            ],
        }

    def test_two_templates_make_two_cloud_calls(self, store_url: str) -> None:
        """Requests of two templates travel in two batches, one call each."""
        clock = ManualClock(EPOCH)
        cloud = FakeCloud(clock=clock)
        with contextlib.closing(open_store(store_url)) as store:
            runtime = manual_runtime(store, cloud, clock)
            futures = runtime.machines.enqueue_many(
                [request(n, D4 if n % 2 else D8) for n in range(6)]
            )
            pass_idle_timeout(runtime, clock)
            outcomes = [future.result(timeout=5) for future in futures]

        assert all(o.created for o in outcomes)
        assert sorted(len(call.request.machines) for call in cloud.calls) == [3, 3]

    def test_120_requests_with_batches_of_50_make_calls_of_50_50_and_20(
        self, store_url: str
    ) -> None:
        """Full batches go at once; the rest goes when the idle timer fires."""
        clock = ManualClock(EPOCH)
        cloud = FakeCloud(clock=clock)
        with contextlib.closing(open_store(store_url)) as store:
            runtime = manual_runtime(store, cloud, clock)
            futures = runtime.machines.enqueue_many([request(n) for n in range(120)])
            full_first = [len(call.request.machines) for call in cloud.calls]
            pass_idle_timeout(runtime, clock)
            outcomes = [future.result(timeout=5) for future in futures]

        assert full_first == [50, 50]
        assert [len(call.request.machines) for call in cloud.calls] == [50, 50, 20]
        assert sum(o.created for o in outcomes) == 120


class TestCrashRecovery:
    @pytest.mark.parametrize("crash", ["after_sealing", "after_dispatch", "after_cloud_call"])
    def test_restart_gives_one_outcome_per_request_and_no_duplicate_machine(
        self, store_url: str, crash: str
    ) -> None:
        """Wherever between sealing and result the process dies, a restart finishes the job."""
        clock = ManualClock(EPOCH)
        fake = FakeCloud(clock=clock)
        with contextlib.closing(open_store(store_url)) as store:
            if crash == "after_sealing":
                runtime = manual_runtime(store, fake, clock, runner=HeldRunner())
                runtime.machines.enqueue_many([request(n) for n in range(5)])
                pass_idle_timeout(runtime, clock)  # sealed and opened; never executed
            else:
                when = "before_call" if crash == "after_dispatch" else "after_call"
                runtime = manual_runtime(store, CrashingCloud(fake, when=when), clock)
                runtime.machines.enqueue_many([request(n) for n in range(5)])
                with pytest.raises(SimulatedCrash):
                    pass_idle_timeout(runtime, clock)
        calls_before_restart = len(fake.calls)

        with contextlib.closing(open_store(store_url)) as store:
            restarted = manual_runtime(store, fake, clock)
            outcomes = [restarted.machines.outcome(f"r-{n}").result(timeout=5) for n in range(5)]
            once = terminal_outcomes(store)

        assert [o.status for o in outcomes] == ["created"] * 5
        assert once == {f"r-{n}": 1 for n in range(5)}
        assert sorted(fake.creations) == [f"m-{n}" for n in range(5)]
        # Read before retry: machines the first run created are read back, never sent again.
        expected_new_calls = 0 if crash == "after_cloud_call" else 1
        assert len(fake.calls) - calls_before_restart == expected_new_calls

    def test_outcomes_reach_the_grouper_after_a_crash_before_recording_them(
        self, store_url: str
    ) -> None:
        """A batch completed but never reported to the grouper is reported on restart."""
        clock = ManualClock(EPOCH)
        fake = FakeCloud(clock=clock)
        with contextlib.closing(open_store(store_url)) as store:
            runtime = manual_runtime(store, fake, clock, runner=HeldRunner())
            runtime.machines.enqueue(request(1, skip_batching=True))
            (batch_id,) = runtime.service.unfinished_batches()
            # This process's coordinator completes the batch and dies before reporting it.
            dying = Coordinator(
                store,
                fake,
                clock=clock,
                runner=InlineRunner(),
                on_complete=lambda *_: None,
                grouper_name="default",
            )
            dying.execute(batch_id)

        with contextlib.closing(open_store(store_url)) as store:
            restarted = manual_runtime(store, fake, clock)
            status = restarted.service.status("r-1")
            grouper_events = [e.type for e in store.read_stream(grouper_stream_id("default"))]

        assert status == ("created", batch_id)
        assert grouper_events[-1] == "vm.BatchOutcomesRecorded"
        assert len(fake.calls) == 1
