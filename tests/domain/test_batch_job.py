"""The batch job: claims, creation requests, observed progress, release and the application."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.codec import from_data, to_data
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.testbeds import batch_job as bj

T0 = datetime(2025, 1, 1, tzinfo=UTC)
REQUEST = bj.ApplicationRequest("bed", (0, 2), ("n1",), 1000, 2048, "batch-high", "fleetledger")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Job:
    """One job stream driven through commands."""

    def __init__(self, kind: bj.AppKind = "spark") -> None:
        self.state = bj.initial_state()
        self(bj.DefineJob("j1", kind, "img:1", "local:///app.jar", ("--in", "hdfs://d"), at=at(0)))

    def __call__(self, command: bj.JobCommand) -> list[bj.JobEvent]:
        events = bj.decide(self.state, command)
        for event in events:
            self.state = bj.evolve(self.state, event)
        return events

    def claim(self, scheduling: str = "s1", seconds: float = 1) -> list[bj.JobEvent]:
        return self(bj.ClaimJob("j1", scheduling, at=at(seconds)))

    def request(self, scheduling: str = "s1", seconds: float = 2) -> list[bj.JobEvent]:
        return self(bj.RequestCreation("j1", scheduling, REQUEST, at=at(seconds)))

    def observe(self, phase: bj.ApplicationPhase, seconds: float = 3) -> list[bj.JobEvent]:
        return self(bj.ObserveApplication("j1", phase, "boom", at=at(seconds)))


def submitted() -> Job:
    job = Job()
    job.claim()
    job.request()
    return job


def created() -> Job:
    """Submitted, and its application created."""
    job = submitted()
    job(bj.RecordApplicationCreated("j1", at=at(2)))
    return job


class TestSurface:
    def test_stream_name(self) -> None:
        """One stream per job."""
        assert bj.stream_name("j1") == "batch-job-j1"


class TestDefine:
    def test_a_new_job_is_ready(self) -> None:
        """A defined job waits, ready, for a scheduling."""
        assert Job().state.status == "ready"

    def test_same_definition_again_changes_nothing(self) -> None:
        """Repeating the definition is a no-op."""
        again = bj.DefineJob(
            "j1", "spark", "img:1", "local:///app.jar", ("--in", "hdfs://d"), at=at(9)
        )
        assert Job()(again) == []

    def test_another_spec_under_the_name_is_refused(self) -> None:
        """A name is one job."""
        with pytest.raises(Rejected, match="new name"):
            Job()(bj.DefineJob("j1", "flink", "img:2", "x.jar", at=at(1)))

    def test_unknown_kind_is_invalid(self) -> None:
        """Only Spark and Flink applications exist."""
        with pytest.raises(InvalidCommand, match="spark"):
            bj.decide(bj.initial_state(), bj.DefineJob("j", "mpi", "i", "m", at=at(0)))  # type: ignore[arg-type]

    def test_commands_for_an_unknown_job_are_refused(self) -> None:
        """Only a defined job can be claimed."""
        with pytest.raises(Rejected, match="define it first"):
            bj.decide(bj.initial_state(), bj.ClaimJob("j1", "s1", at=at(0)))

    def test_a_command_for_another_job_is_invalid(self) -> None:
        """Commands name the stream's job."""
        with pytest.raises(InvalidCommand, match="stream of j1"):
            Job()(bj.ClaimJob("j2", "s1", at=at(1)))


class TestClaim:
    def test_claim_puts_the_job_in_the_queue(self) -> None:
        """A claimed job is in its scheduling's queue."""
        job = Job()
        assert job.claim() == [bj.JobClaimed("j1", "s1", at(1))]
        assert (job.state.status, job.state.holder) == ("in_queue", "s1")

    def test_claim_again_by_the_holder_changes_nothing(self) -> None:
        """The holder's repeated claim is a no-op (a retried append)."""
        job = Job()
        job.claim()
        assert job.claim(seconds=2) == []

    def test_claim_by_another_scheduling_is_refused(self) -> None:
        """Only one scheduling holds a job."""
        job = Job()
        job.claim("s1")
        with pytest.raises(Rejected, match="held by scheduling s1"):
            job.claim("s2")

    def test_a_finished_job_is_claimed_again_only_after_its_release(self) -> None:
        """A completed job stays with its scheduling until released; released, its application
        is deleted, and once that is observed another scheduling can run it again."""
        job = created()
        job.observe("completed", 4)
        with pytest.raises(Rejected, match="held by scheduling s1"):
            job.claim("s2", 5)
        job(bj.ReleaseJob("j1", "s1", at=at(6)))
        with pytest.raises(Rejected, match="deleting its previous application"):
            job.claim("s2", 7)
        job.observe("absent", 8)
        assert job.claim("s2", 9) == [bj.JobClaimed("j1", "s2", at(9))]


class TestRequestCreation:
    def test_request_submits_with_replication_equal_to_the_slot_count(self) -> None:
        """The creation request records the slots; replication is their number."""
        job = Job()
        job.claim()
        [event] = job.request()
        assert event == bj.ApplicationRequested("j1", "s1", REQUEST, 2, at(2))
        assert job.state.status == "submitted"

    def test_only_the_holder_may_request(self) -> None:
        """A scheduling that does not hold the job cannot submit it."""
        job = Job()
        job.claim("s1")
        with pytest.raises(Rejected, match="not held by scheduling s2"):
            job.request("s2")

    def test_repeated_request_changes_nothing(self) -> None:
        """The same request again (a retried append) is a no-op."""
        job = submitted()
        assert job.request(seconds=5) == []

    @pytest.mark.parametrize("slot_ids", [(), (1, 1), (-1,)])
    def test_bad_slot_ids_are_invalid(self, slot_ids: tuple[int, ...]) -> None:
        """Slot ids are distinct, non-negative, and there is at least one."""
        job = Job()
        job.claim()
        bad = bj.ApplicationRequest("bed", slot_ids, ("n1",), 1, 1, "p", "s")
        with pytest.raises(InvalidCommand, match="slot ids"):
            job(bj.RequestCreation("j1", "s1", bad, at=at(2)))


class TestObservedProgress:
    def test_full_path_records_start_and_completion(self) -> None:
        """Submitted → scheduled → running → completed, with start and completion times."""
        job = submitted()
        job.observe("pending", 3)
        assert job.state.status == "submitted"
        assert job.observe("scheduled", 4) == [bj.JobScheduled("j1", at(4))]
        assert job.observe("running", 5) == [bj.JobRunning("j1", at(5))]
        assert job.observe("running", 6) == []
        assert job.observe("completed", 7) == [bj.JobCompleted("j1", at(7))]
        assert (job.state.started_at, job.state.completed_at) == (at(5), at(7))

    def test_running_may_skip_scheduled(self) -> None:
        """A job seen running straight after submission is running."""
        job = submitted()
        job.observe("running")
        assert job.state.status == "running"

    @pytest.mark.parametrize("steps", [2, 3, 4])
    def test_completed_from_any_earlier_state_of_the_run(self, steps: int) -> None:
        """An application observed completed finishes the job from any earlier state of its
        run: submitted, scheduled or running (the controller may have been down)."""
        job = Job()
        for step in ("claim", "request", "scheduled", "running")[:steps]:
            if step == "claim":
                job.claim()
            elif step == "request":
                job.request()
            else:
                job.observe(step)  # type: ignore[arg-type]
        job.observe("completed", 10)
        assert (job.state.status, job.state.completed_at) == ("completed", at(10))

    @pytest.mark.parametrize("claimed", [False, True])
    def test_a_completed_application_without_a_request_is_not_this_run(self, claimed: bool) -> None:
        """A ready or queued job has requested nothing: a completed application seen then is an
        earlier run's, waiting to be deleted, and does not finish the job."""
        job = Job()
        if claimed:
            job.claim()
        assert job.observe("completed") == []
        assert job.state.status == ("in_queue" if claimed else "ready")

    def test_failure_is_terminal(self) -> None:
        """A failed application fails the job; later observations change nothing."""
        job = created()
        assert job.observe("failed") == [bj.JobFailed("j1", "boom", at(3))]
        assert job.observe("completed", 4) == []

    def test_live_application_without_a_request_is_ignored(self) -> None:
        """A queued job does not start from an application it never asked for."""
        job = Job()
        job.claim()
        assert job.observe("running") == []


class TestRelease:
    def test_release_of_a_queued_job_makes_it_ready(self) -> None:
        """A released queued job is ready again, with nothing to delete."""
        job = Job()
        job.claim()
        assert job(bj.ReleaseJob("j1", "s1", at=at(2))) == [
            bj.JobReleased("j1", "s1", False, at(2))
        ]
        assert (job.state.status, job.state.holder) == ("ready", None)
        assert bj.application_to_delete(job.state) is None

    def test_release_of_a_running_job_deletes_the_application_first(self) -> None:
        """A released running job must delete its application before it can be claimed again."""
        job = submitted()
        job.observe("running")
        job(bj.ReleaseJob("j1", "s1", at=at(4)))
        assert job.state.status == "ready"
        assert bj.application_to_delete(job.state) == "j1-app"
        with pytest.raises(Rejected, match="deleting its previous application"):
            job.claim("s2", 5)
        assert job.observe("absent", 6) == [bj.ApplicationDeleted("j1", at(6))]
        assert job.claim("s2", 7) == [bj.JobClaimed("j1", "s2", at(7))]

    def test_release_by_another_scheduling_changes_nothing(self) -> None:
        """Only the holder releases."""
        job = Job()
        job.claim("s1")
        assert job(bj.ReleaseJob("j1", "s2", at=at(2))) == []

    @pytest.mark.parametrize("outcome", ["completed", "failed"])
    def test_release_of_a_finished_job_deletes_its_application(
        self, outcome: Literal["completed", "failed"]
    ) -> None:
        """Released, a finished job's application is deleted too (nothing leaks) and the job is
        ready once that is observed; the run it finished is kept with its times."""
        job = created()
        job.observe("running", 4)
        job.observe(outcome, 5)
        [released] = job(bj.ReleaseJob("j1", "s1", at=at(6)))
        assert released == bj.JobReleased("j1", "s1", True, at(6))
        assert (job.state.status, job.state.holder) == ("ready", None)
        assert bj.application_to_delete(job.state) == "j1-app"
        assert job.observe("absent", 7) == [bj.ApplicationDeleted("j1", at(7))]
        assert job.state.runs == (
            bj.JobRun("s1", (0, 2), at(2), at(4), at(5), outcome, job.state.message),
        )

    def test_a_released_job_ignores_its_old_application_until_it_is_gone(self) -> None:
        """The old application, still completed while it is deleted, does not finish the ready
        job again."""
        job = created()
        job.observe("completed", 4)
        job(bj.ReleaseJob("j1", "s1", at=at(5)))
        assert job.observe("completed", 6) == []
        assert job.state.status == "ready"

    def test_runs_accumulate_across_schedulings(self) -> None:
        """A job run by two schedulings in turn keeps both runs, in order."""
        job = created()
        job.observe("completed", 4)
        job(bj.ReleaseJob("j1", "s1", at=at(5)))
        job.observe("absent", 6)
        job.claim("s2", 7)
        job.request("s2", 8)
        job(bj.RecordApplicationCreated("j1", at=at(9)))
        job.observe("completed", 10)
        job(bj.ReleaseJob("j1", "s2", at=at(11)))
        assert [(r.scheduling, r.outcome, r.completed_at) for r in job.state.runs] == [
            ("s1", "completed", at(4)),
            ("s2", "completed", at(10)),
        ]


class TestCreationRecord:
    def test_the_creation_is_recorded_once_per_request(self) -> None:
        """The process records the creation; again for the same request, nothing."""
        job = submitted()
        assert job(bj.RecordApplicationCreated("j1", at=at(3))) == [
            bj.ApplicationCreated("j1", at(3))
        ]
        assert job.state.application_created
        assert job(bj.RecordApplicationCreated("j1", at=at(4))) == []

    def test_seeing_the_application_records_its_creation(self) -> None:
        """An application observed present before its creation was recorded (a crash between
        creating and recording) is recorded created, so it is never created twice."""
        job = submitted()
        assert job.observe("pending", 3) == [bj.ApplicationCreated("j1", at(3))]
        assert job.observe("pending", 4) == []

    def test_nothing_to_record_without_a_request(self) -> None:
        """A queued job has no application to have created."""
        job = Job()
        job.claim()
        assert job(bj.RecordApplicationCreated("j1", at=at(2))) == []


class TestLostApplication:
    @pytest.mark.parametrize("phase", ["pending", "scheduled", "running"])
    def test_an_application_gone_after_its_creation_sends_the_job_back(
        self, phase: bj.ApplicationPhase
    ) -> None:
        """Observed absent after it was created, the application is lost: the job is ready
        again and, still held by its scheduling, in its queue; the lost run is kept."""
        job = created()
        job.observe(phase, 3)
        assert job.observe("absent", 4) == [bj.ApplicationLost("j1", "s1", at(4))]
        state = job.state
        assert (state.status, state.holder, state.application) == ("in_queue", "s1", None)
        assert [r.outcome for r in state.runs] == ["lost"]
        assert job.request(seconds=5)
        assert job.state.status == "submitted" and not job.state.application_created

    def test_absent_before_the_creation_is_not_a_loss(self) -> None:
        """Requested but not created yet: absent is what the process is about to change."""
        job = submitted()
        assert job.observe("absent") == []
        assert job.state.status == "submitted"

    def test_a_finished_jobs_application_may_go(self) -> None:
        """A completed job keeps its outcome when its application is removed."""
        job = created()
        job.observe("completed", 3)
        assert job.observe("absent", 4) == []
        assert job.state.status == "completed"


class TestDelete:
    def test_delete_is_refused_while_held(self) -> None:
        """The refusal names the holder and what to do."""
        job = Job()
        job.claim("s1")
        with pytest.raises(
            Rejected, match="job j1 is held by scheduling s1; release that scheduling first"
        ):
            job(bj.DeleteJob("j1", at=at(2)))

    def test_delete_is_recorded_once(self) -> None:
        """Deleting records the fact; again, nothing."""
        job = Job()
        assert job(bj.DeleteJob("j1", at=at(1))) == [bj.JobDeleted("j1", at(1))]
        assert job.state.deleted
        assert job(bj.DeleteJob("j1", at=at(2))) == []

    def test_a_deleted_job_cannot_be_claimed(self) -> None:
        """No scheduling takes a deleted job."""
        job = Job()
        job(bj.DeleteJob("j1", at=at(1)))
        with pytest.raises(Rejected, match="j1 is deleted; define it again"):
            job.claim()

    def test_defining_it_again_recreates_it(self) -> None:
        """The name can be defined again, with any spec, and the job is ready and claimable."""
        job = Job()
        job(bj.DeleteJob("j1", at=at(1)))
        assert job(bj.DefineJob("j1", "flink", "img:2", "x.jar", at=at(2)))
        assert (job.state.deleted, job.state.status) == (False, "ready")
        assert job.state.defined is not None and job.state.defined.kind == "flink"
        assert job.claim(seconds=3)

    def test_a_deleted_jobs_application_deletion_is_still_recorded(self) -> None:
        """A job released and then deleted still has its old application deleted: the
        observation of its absence is recorded."""
        job = created()
        job(bj.ReleaseJob("j1", "s1", at=at(3)))
        job(bj.DeleteJob("j1", at=at(4)))
        assert job.observe("absent", 5) == [bj.ApplicationDeleted("j1", at(5))]
        assert bj.application_to_delete(job.state) is None


_COMMANDS = st.sampled_from(
    [
        *("claim_s1", "claim_s2", "request_s1", "request_s2", "release_s1", "release_s2"),
        *("pending", "scheduled", "running", "completed", "failed", "absent"),
        *("created", "delete", "define"),
    ]
)


class TestInvariants:
    @settings(max_examples=150, deadline=None)
    @given(st.lists(_COMMANDS, max_size=15))
    def test_holder_and_application_stay_consistent(self, commands: list[str]) -> None:
        """Whatever happens, a job with an application has a holder and a replication equal to
        its slot count; a finished job becomes unfinished only by its release; a deleted job is
        held by nobody; and a job is claimable only with no application left to delete."""
        job = Job()
        for i, name in enumerate(commands):
            seconds = i + 1
            before = job.state
            try:
                if name.startswith("claim"):
                    job.claim(name[-2:], seconds)
                elif name.startswith("request"):
                    job.request(name[-2:], seconds)
                elif name.startswith("release"):
                    job(bj.ReleaseJob("j1", name[-2:], at=at(seconds)))
                elif name == "created":
                    job(bj.RecordApplicationCreated("j1", at=at(seconds)))
                elif name == "delete":
                    job(bj.DeleteJob("j1", at=at(seconds)))
                elif name == "define":
                    job(bj.DefineJob("j1", "spark", "img:1", "local:///app.jar", at=at(seconds)))
                else:
                    job.observe(name, seconds)  # type: ignore[arg-type]
            except Rejected:
                pass
            state = job.state
            if state.status in ("submitted", "scheduled", "running"):
                assert state.holder is not None and state.application is not None
                assert state.application.replication == len(state.application.request.slot_ids)
            if before.status in ("completed", "failed") and state.status != before.status:
                assert name.startswith("release") and state.status == "ready"
            if state.deleted:
                assert state.holder is None
            if state.holder is not None and before.holder is None:
                assert not before.deleting_application


EVENTS = [
    bj.JobDefined("j1", "flink", "img", "x.jar", ("a",), T0),
    bj.JobClaimed("j1", "s1", T0),
    bj.ApplicationRequested("j1", "s1", REQUEST, 2, T0),
    bj.JobScheduled("j1", T0),
    bj.JobRunning("j1", T0),
    bj.JobCompleted("j1", T0),
    bj.JobFailed("j1", "oom", T0),
    bj.JobReleased("j1", "s1", True, T0),
    bj.ApplicationDeleted("j1", T0),
]


class TestCodec:
    @pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
    def test_round_trip(self, event: bj.JobEvent) -> None:
        """Every job event survives the codec under a ``batch_job.`` name."""
        name, version, data = to_data(event)
        assert name.startswith("batch_job.") and version == 1
        assert from_data(name, version, data) == event
