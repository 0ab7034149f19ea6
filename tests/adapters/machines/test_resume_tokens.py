"""A create interrupted by a crash is resumed from the log's resume token, never re-created.

Real azure-mgmt-compute client against the fake ARM server: the first process records the LRO
continuation token (``MachineCreateAccepted``) and dies; a new process with a new client resumes
that operation from the token and records the outcome, with no second PUT.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

import pytest
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.containerservice import ContainerServiceClient

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    CloudMachines,
    MachineObservation,
    ProgressCallback,
    ProgressNote,
)
from fleetledger.adapters.cloud.aks import PREVIEW_API_VERSION, AksMachinesCloud
from fleetledger.adapters.cloud.azure_vm import AzureVmCloud
from fleetledger.adapters.machines import CoordinatorOptions
from fleetledger.eventstore import open_store
from tests.adapters.cloud.fake_arm import FakeArmServer, StaticTokenCredential
from tests.adapters.cloud.support import PROFILE, SUBSCRIPTION

from .support import EPOCH, SimulatedCrash, manual_runtime, request


@contextlib.contextmanager
def vm_cloud(server: FakeArmServer) -> Iterator[AzureVmCloud]:
    with ComputeManagementClient(
        StaticTokenCredential(), SUBSCRIPTION, **server.client_options()
    ) as client:
        yield AzureVmCloud(client, resource_group="rg", profile=PROFILE)


@contextlib.contextmanager
def aks_cloud(server: FakeArmServer, clock: ManualClock) -> Iterator[AksMachinesCloud]:
    with ContainerServiceClient(
        StaticTokenCredential(),
        SUBSCRIPTION,
        api_version=PREVIEW_API_VERSION,
        **server.client_options(),
    ) as client:
        yield AksMachinesCloud(
            client, resource_group="rg", cluster_name="fleet", agent_pool="burst", clock=clock
        )


def wait_for_broken_poll(server: FakeArmServer, timeout: float = 10.0) -> None:
    """Block until the orphaned poller has spent the broken poll (a state, not a delay)."""
    deadline = time.monotonic() + timeout
    while not any(r.status == 500 for r in server.requests):
        if time.monotonic() > deadline:
            raise AssertionError("the dead process's poller never polled")
        time.sleep(0.005)


class DiesOnceAccepted:
    """The process dies right after the cloud accepted the create and the token was noted."""

    def __init__(self, inner: CloudMachines) -> None:
        self._inner = inner

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        def note_then_die(notes: Sequence[ProgressNote]) -> None:
            assert on_progress is not None
            on_progress(notes)
            raise SimulatedCrash

        return self._inner.create_batch(request, on_progress=note_then_die)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self._inner.read_machine(machine_name, resume_token=resume_token)


class TestResumeToken:
    def test_restart_resumes_the_accepted_create_without_a_second_put(self, store_url: str) -> None:
        """The token recorded before the crash finishes the create in the next process."""
        clock = ManualClock(EPOCH)
        per_machine = CoordinatorOptions(dispatch_mode="per_machine")
        with FakeArmServer() as server:
            # The SDK keeps polling in a daemon thread of the dead process; break that poll so
            # the create can only finish if the new process resumes it from the recorded token
            # (a plain read would see the machine "Creating" forever).
            server.break_next_polls(1)
            with contextlib.closing(open_store(store_url)) as store, vm_cloud(server) as cloud:
                runtime = manual_runtime(
                    store, DiesOnceAccepted(cloud), clock, coordinator_options=per_machine
                )
                with pytest.raises(SimulatedCrash):
                    # A skip-batching request seals and runs inline, dying mid-create.
                    runtime.machines.enqueue(request(1, skip_batching=True))
                accepted = [
                    e.data for e in store.read_all() if e.type == "vm.MachineCreateAccepted"
                ]
            wait_for_broken_poll(server)

            with contextlib.closing(open_store(store_url)) as store, vm_cloud(server) as cloud:
                restarted = manual_runtime(store, cloud, clock, coordinator_options=per_machine)
                outcome = restarted.machines.outcome("r-1").result(timeout=5)

            puts = server.puts()

        assert [a["machine_name"] for a in accepted] == ["m-1"]
        assert accepted[0]["resume_token"]
        assert outcome.status == "created"
        assert len(puts) == 1

    def test_a_create_found_failed_after_a_restart_is_deleted_and_recorded(
        self, store_url: str
    ) -> None:
        """The AKS batch PUT was accepted, then the process died; the next process resumes the
        create, finds it failed, deletes the leftover and records the failure as deleted."""
        clock = ManualClock(EPOCH)
        with FakeArmServer() as server:
            server.fail_async("m-1", "AllocationFailed")
            with (
                contextlib.closing(open_store(store_url)) as store,
                aks_cloud(server, clock) as cloud,
            ):
                runtime = manual_runtime(store, DiesOnceAccepted(cloud), clock)
                with pytest.raises(SimulatedCrash):
                    runtime.machines.enqueue(request(1, skip_batching=True))
            tags = server.machine_tags("m-1")

            with (
                contextlib.closing(open_store(store_url)) as store,
                aks_cloud(server, clock) as cloud,
            ):
                restarted = manual_runtime(store, cloud, clock)
                outcome = restarted.machines.outcome("r-1").result(timeout=5)
                failures = [e.data for e in store.read_all() if e.type == "vm.MachineFailed"]

            deletions, remaining = server.deletions, server.machine_names()

        assert tags["fleetledger-request"] == "r-1"
        assert outcome.status == "failed"
        assert [(f["machine_name"], f["deleted"]) for f in failures] == [("m-1", True)]
        assert (deletions, remaining) == (("m-1",), ())
