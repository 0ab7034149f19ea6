"""The scheduling process on the host: claims, submission, confirmation, completion, release,
and the jobs' applications — every step through the log, each idempotent."""

from __future__ import annotations

import pytest

from fleetledger.adapters.testbeds import (
    CommandRejected,
    FakeApplications,
    InvalidTestbedCommand,
    TestbedsRuntime,
)
from fleetledger.domain.testbeds import batch_job, scheduling, testbed
from fleetledger.eventstore import EventStore

from .support import BED, World, stream_types, world

QUEUE = ("j2", "j1", "j2", "j1")


def run_all(w: World) -> None:
    """Settle, place pods, start and finish applications until the first scheduling finishes."""
    for _ in range(20):
        w.settle()
        w.place_pending()
        w.settle()
        for job in ("j1", "j2"):
            app = batch_job.application_name(job)
            phase = w.apps.phase(app)
            if phase == "scheduled":
                w.apps.start(app)
            elif phase == "running":
                w.apps.finish(app)
        if w.service.scheduling("s1").state.phase == "finished":
            return
    raise AssertionError("s1 did not finish in 20 passes")


class TestClaims:
    def test_jobs_and_testbed_are_claimed_in_one_append(self, store: EventStore) -> None:
        """Every job's JobClaimed, the testbed's TestbedClaimed and the scheduling's
        ClaimsGranted land in one transaction (consecutive global positions)."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.runtime.process._claim("s1")

        claims = [
            r
            for r in store.read_all()
            if r.type
            in ("batch_job.JobClaimed", "testbed.TestbedClaimed", "scheduling.ClaimsGranted")
        ]
        positions = [r.global_position for r in claims]
        assert len(claims) == 4
        assert positions == list(range(positions[0], positions[0] + 4))
        assert w.service.job("j1").state.holder == "s1"
        assert w.service.testbed(BED).state.holder == "s1"
        assert w.service.scheduling("s1").state.phase == "submission"

    def test_a_held_job_makes_the_later_scheduling_wait(self, store: EventStore) -> None:
        """A scheduling naming a job another holds records the conflict, holds nothing and
        stays in acquire; further passes record nothing more."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()
        w.service.create_scheduling("s2", testbed=BED, queue=("j1",))
        w.settle()
        version = w.service.scheduling("s2").version

        w.settle()

        s2 = w.service.scheduling("s2").state
        assert s2.phase == "acquire" and not s2.held_jobs and not s2.holds_testbed
        assert s2.last_conflict is not None and "held by scheduling s1" in s2.last_conflict.reason
        assert w.service.scheduling("s2").version == version
        assert w.service.job("j1").state.holder == "s1"

    def test_an_unknown_job_blocks_acquire_with_its_reason(self, store: EventStore) -> None:
        """A scheduling naming a job that does not exist waits, saying so."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=("nope",))
        w.settle()

        state = w.service.scheduling("s1").state
        assert state.phase == "acquire"
        assert state.last_conflict is not None and "define it first" in state.last_conflict.reason


class TestSubmission:
    def test_queue_assigns_round_robin_slots(self, store: EventStore) -> None:
        """[j2, j1, j2, j1] over free slots 0–3: j2 on {0, 2}, j1 on {1, 3}; each job's
        application is requested with its slots' nodes in the same append as JobsAssigned."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()

        state = w.service.scheduling("s1").state
        assert state.phase == "confirmation"
        assert {a.job: a.slot_ids for a in state.assignments} == {"j2": (0, 2), "j1": (1, 3)}
        j1 = w.service.job("j1").state
        assert j1.status == "submitted"
        assert j1.application is not None
        assert j1.application.request.nodes == ("n2",)
        assert j1.application.replication == 2

    def test_nothing_is_assigned_before_the_ghosts_exist(self, store: EventStore) -> None:
        """Slots without their ghost pod are not free: a scheduling on a testbed whose cluster
        was never observed waits in submission."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.runtime.process.advance("s1")

        assert w.service.scheduling("s1").state.phase == "submission"

    def test_each_application_is_created_once(self, store: EventStore) -> None:
        """Passes repeated while a job is submitted do not create its application again."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()
        w.settle()
        w.runtime.process.advance_job("j1")

        assert sorted(w.apps.created) == ["j1-app", "j2-app"]
        assert len(w.apps.pods("j1-app")) == 2


class TestLifecycle:
    def test_jobs_run_to_completion_and_the_scheduling_finishes(self, store: EventStore) -> None:
        """Confirmation once every pod has a node, completion once both jobs completed, and the
        release gives back jobs and testbed."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        run_all(w)

        assert stream_types(store, scheduling.stream_name("s1")) == [
            "SchedulingCreated",
            "ClaimsGranted",
            "JobsAssigned",
            "SubmissionConfirmed",
            "SchedulingCompleted",
            "SchedulingReleased",
        ]
        assert stream_types(store, batch_job.stream_name("j1")) == [
            "JobDefined",
            "JobClaimed",
            "ApplicationRequested",
            "JobScheduled",
            "JobRunning",
            "JobCompleted",
            "JobReleased",
        ]
        assert w.service.job("j1").state.status == "completed"
        assert w.service.testbed(BED).state.holder is None

    def test_slots_are_free_again_after_the_jobs(self, store: EventStore) -> None:
        """Once the jobs' pods are gone their reservations clear and the ghosts come back."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        run_all(w)
        w.settle()

        state = w.service.testbed(BED).state
        assert state.reservations == {}
        assert testbed.free_slot_ids(state) == (0, 1, 2, 3)

    def test_the_waiting_scheduling_claims_after_the_release(self, store: EventStore) -> None:
        """A scheduling sharing only the testbed waits in acquire until the first releases,
        then runs its own job."""
        w = world(store, jobs=("j1", "j2", "j3"))
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()
        w.service.create_scheduling("s3", testbed=BED, queue=("j3",))
        w.settle()
        assert w.service.scheduling("s3").state.phase == "acquire"

        run_all(w)
        w.settle()

        s3 = w.service.scheduling("s3").state
        assert s3.holds_testbed and s3.held_jobs == {"j3"}
        assert s3.assignments == (scheduling.Assignment("j3", (0,)),)

    def test_online_extension_runs_the_added_jobs(self, store: EventStore) -> None:
        """Jobs added to a running scheduling are claimed and assigned too."""
        w = world(store, jobs=("j1", "j2", "j3"))
        w.service.create_scheduling("s1", testbed=BED, queue=("j2", "j2"))
        w.settle()
        w.service.extend_scheduling("s1", queue=("j3",))
        w.place_pending()
        w.settle()

        state = w.service.scheduling("s1").state
        assert w.service.job("j3").state.holder == "s1"
        assert {a.job for a in state.assignments} == {"j2", "j3"}


class TestRelease:
    def test_releasing_a_running_scheduling_deletes_the_applications(
        self, store: EventStore
    ) -> None:
        """A release while jobs run sends them back to ready: their applications are deleted
        and, once the deletion is observed, the jobs can be claimed again."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()
        w.place_pending()
        w.settle()
        assert w.service.job("j1").state.status == "scheduled"

        w.runtime.process.release("s1")
        w.settle()

        j1 = w.service.job("j1").state
        assert (j1.status, j1.holder, batch_job.application_to_delete(j1)) == ("ready", None, None)
        assert w.apps.phase("j1-app") == "absent"
        assert stream_types(store, batch_job.stream_name("j1"))[-2:] == [
            "JobReleased",
            "ApplicationDeleted",
        ]
        assert w.service.scheduling("s1").state.phase == "finished"

    def test_a_second_release_appends_nothing(self, store: EventStore) -> None:
        """Releasing a finished scheduling is a no-op."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()
        w.runtime.process.release("s1")

        assert w.runtime.process.release("s1") == 0


class TestRestart:
    def test_a_job_completed_while_down_skips_the_states_between(self, store: EventStore) -> None:
        """The application ran and completed while no controller watched: a new runtime finds
        the job submitted and records it completed directly."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()
        w.runtime.stop()
        w.place_pending()
        w.apps.finish("j1-app")

        restarted = TestbedsRuntime(store, w.cluster, w.apps, clock=w.clock, threads=False)
        restarted.start()
        w.clock.advance(1)
        restarted.run_until_settled()

        assert stream_types(store, batch_job.stream_name("j1"))[-2:] == [
            "ApplicationRequested",
            "JobCompleted",
        ]
        assert restarted.service.schedulings() == ("s1",)

    def test_a_new_runtime_does_not_redo_side_effects(self, store: EventStore) -> None:
        """After a restart the ghosts and applications already there are not created again."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()
        created = w.cluster.creations

        restarted = TestbedsRuntime(store, w.cluster, w.apps, clock=w.clock, threads=False)
        restarted.start()
        w.clock.advance(1)
        restarted.run_until_settled()

        assert w.cluster.creations == created
        assert sorted(w.apps.created) == ["j1-app", "j2-app"]


class TestErrors:
    def test_a_malformed_command_is_invalid(self, store: EventStore) -> None:
        """A bad testbed definition is refused with the domain's reason, nothing appended."""
        w = world(store, define=False)
        with pytest.raises(InvalidTestbedCommand, match="slots_per_node"):
            w.service.define_testbed(
                BED, node_label="testbed", slots_per_node=0, cpu_millis=1, memory_mib=1
            )
        assert store.head() == 0

    def test_a_refused_command_says_why(self, store: EventStore) -> None:
        """Redefining a job with another spec is refused with what to do instead."""
        w = world(store)
        with pytest.raises(CommandRejected, match="use a new name"):
            w.service.define_job("j1", kind="flink", image="x", main_file="y")


def test_fake_applications_are_absent_until_created(store: EventStore) -> None:
    """The fake operator knows only what it created."""
    w = world(store, define=False)
    assert isinstance(w.apps, FakeApplications)
    assert w.apps.phase("anything") == "absent"
