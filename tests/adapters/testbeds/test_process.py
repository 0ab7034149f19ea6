"""The scheduling process on the host: claims, submission, confirmation, completion, release,
and the jobs' applications — every step through the log, each idempotent."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleetledger.adapters.testbeds import (
    GHOST_LABEL,
    CommandRejected,
    FakeApplications,
    InvalidTestbedCommand,
    TestbedsRuntime,
)
from fleetledger.adapters.testbeds.manifests import application_manifest
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

        state = w.service.scheduling("s1").state
        assert state.phase == "submission"
        assert state.blocked is None

    def test_a_job_bigger_than_the_testbed_is_recorded_as_blocked(self, store: EventStore) -> None:
        """Five copies of j1 on four slots can never start: the scheduling says so in the log
        rather than waiting silently with every slot free."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=("j1",) * 5)
        w.settle()

        state = w.service.scheduling("s1").state
        assert state.phase == "submission" and state.assignments == ()
        assert state.blocked is not None and "needs 5 slots but testbed bed has 4" in (
            state.blocked.reason
        )
        assert testbed.free_slot_ids(w.service.testbed(BED).state) == (0, 1, 2, 3)

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
            "ApplicationCreated",
            "JobScheduled",
            "JobRunning",
            "JobCompleted",
            "JobReleased",
            "ApplicationDeleted",
        ]
        j1 = w.service.job("j1").state
        assert (j1.status, j1.holder) == ("ready", None)
        assert [run.outcome for run in j1.runs] == ["completed"]
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

        assert stream_types(store, batch_job.stream_name("j1"))[-3:] == [
            "ApplicationRequested",
            "ApplicationCreated",
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


def finish_running(w: World, jobs: tuple[str, ...]) -> None:
    """The fake operator's part: scheduled applications start, running ones complete."""
    for job in jobs:
        app = batch_job.application_name(job)
        phase = w.apps.phase(app)
        if phase == "scheduled":
            w.apps.start(app)
        elif phase == "running":
            w.apps.finish(app)


def run_until(w: World, jobs: tuple[str, ...], done: Callable[[], bool], passes: int = 40) -> None:
    for _ in range(passes):
        w.settle()
        w.place_pending()
        w.settle()
        finish_running(w, jobs)
        if done():
            return
    raise AssertionError(f"not done in {passes} passes")


class TestReleaseCycle:
    def test_a_released_completed_jobs_application_is_deleted(self, store: EventStore) -> None:
        """Completed jobs keep their application until their scheduling is released; then it is
        deleted too, so nothing is left behind."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        run_all(w)
        w.settle()

        assert w.apps.phase("j1-app") == w.apps.phase("j2-app") == "absent"
        assert batch_job.application_to_delete(w.service.job("j1").state) is None

    def test_a_second_scheduling_runs_a_job_of_the_first_again(self, store: EventStore) -> None:
        """s2 names j1, which s1 ran: it waits while s1 holds j1, then claims it once s1 is
        released and its old application deleted, and runs it a second time."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()
        w.service.create_scheduling("s2", testbed=BED, queue=("j1", "j1"))

        run_until(w, ("j1", "j2"), lambda: w.service.scheduling("s2").state.phase == "finished")

        j1 = w.service.job("j1").state
        assert [(r.scheduling, r.outcome) for r in j1.runs] == [
            ("s1", "completed"),
            ("s2", "completed"),
        ]
        assert w.apps.created.count("j1-app") == 2
        assert w.apps.phase("j1-app") == "absent"

    def test_an_interleaved_queue_longer_than_the_testbed_finishes(self, store: EventStore) -> None:
        """[j1, j2] alternating three times over four slots: j1 starts on three slots at once
        (its third index never exists), j2 once they are free again; nothing deadlocks."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=("j1", "j2") * 3)

        run_until(w, ("j1", "j2"), lambda: w.service.scheduling("s1").state.phase == "finished")

        runs = {job: w.service.job(job).state.runs for job in ("j1", "j2")}
        assert runs["j1"][0].slot_ids == (0, 1, 2)
        assert len(runs["j2"][0].slot_ids) == 3
        assert all(r[0].outcome == "completed" for r in runs.values())


class TestApplications:
    def test_an_application_is_created_once_per_request(self, store: EventStore) -> None:
        """Passes repeated on a submitted job record its creation once and create nothing
        more."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=QUEUE)
        w.settle()
        for _ in range(3):
            w.runtime.process.advance_job("j1")

        assert w.apps.created.count("j1-app") == 1
        assert stream_types(store, batch_job.stream_name("j1")).count("ApplicationCreated") == 1

    def test_a_crash_between_creating_and_recording_creates_nothing_twice(
        self, store: EventStore
    ) -> None:
        """The application exists but its creation was never recorded (the process died in
        between): the next pass records it from what it sees and does not create it again."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=("j1",))
        w.runtime.reconciler.reconcile(BED)
        w.runtime.process.advance("s1")
        state = w.service.job("j1").state
        manifest = application_manifest(state, namespace="default")
        assert manifest is not None
        w.apps.create(manifest)

        w.runtime.process.advance_job("j1")

        assert w.apps.created == ["j1-app"]
        assert w.service.job("j1").state.application_created

    def test_an_application_that_disappears_sends_the_job_back_to_its_queue(
        self, store: EventStore
    ) -> None:
        """Deleted behind the controller's back, the application is lost: the job goes back to
        its scheduling's queue, is assigned again and its application created anew."""
        w = world(store)
        w.service.create_scheduling("s1", testbed=BED, queue=("j1",))
        w.settle()
        w.place_pending()
        w.settle()
        assert w.service.job("j1").state.status == "scheduled"

        w.apps.delete("j1-app")
        w.settle()
        w.settle()

        j1 = w.service.job("j1").state
        assert [r.outcome for r in j1.runs] == ["lost"]
        assert "JobRequeued" in stream_types(store, scheduling.stream_name("s1"))
        assert j1.status in ("submitted", "scheduled") and j1.holder == "s1"
        assert w.apps.created == ["j1-app", "j1-app"]

    def test_an_application_the_operator_refuses_fails_the_job(self, store: EventStore) -> None:
        """A job whose application cannot be built fails, with the reason, and its scheduling
        completes instead of waiting for it."""
        w = world(store, define=False)
        w.service.define_testbed(
            BED, node_label="testbed", slots_per_node=2, cpu_millis=1000, memory_mib=512
        )
        w.service.define_job("j1", kind="spark", image="spark:3.5", main_file="/j1.py")
        w.service.create_scheduling("s1", testbed=BED, queue=("j1",))
        w.settle()

        j1 = w.service.job("j1").state
        assert j1.status == "ready" and j1.runs[0].outcome == "failed"
        assert j1.runs[0].message
        assert w.apps.created == []
        assert w.service.scheduling("s1").state.phase == "finished"


class TestDeletion:
    def test_a_deleted_job_is_waited_for_until_defined_again(self, store: EventStore) -> None:
        """A scheduling naming a deleted job waits in acquire, saying so; defining the job again
        lets it go on."""
        w = world(store)
        w.service.execute(
            w.service.job("j1"), lambda at: batch_job.DeleteJob("j1", at=at), cause="test"
        )
        w.service.create_scheduling("s1", testbed=BED, queue=("j1",))
        w.settle()
        state = w.service.scheduling("s1").state
        assert state.phase == "acquire"
        assert state.last_conflict is not None and "j1 is deleted" in state.last_conflict.reason

        w.service.define_job("j1", kind="spark", image="spark:3.5", main_file="/j1.py")
        w.settle()
        assert w.service.scheduling("s1").state.phase == "confirmation"

    def test_a_deleted_testbed_loses_its_ghost_pods(self, store: EventStore) -> None:
        """Deleting the testbed removes every ghost pod from the cluster."""
        w = world(store)
        w.settle()
        assert len(w.cluster.list_pods(labels={GHOST_LABEL: BED})) == 4

        w.service.execute(
            w.service.testbed(BED), lambda at: testbed.DeleteTestbed(BED, at=at), cause="test"
        )
        w.settle()

        assert w.cluster.list_pods(labels={GHOST_LABEL: BED}) == []


def test_fake_applications_are_absent_until_created(store: EventStore) -> None:
    """The fake operator knows only what it created."""
    w = world(store, define=False)
    assert isinstance(w.apps, FakeApplications)
    assert w.apps.phase("anything") == "absent"
