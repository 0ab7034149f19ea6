"""The batch job: claims, creation requests, observed progress, release and the application."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.codec import from_data, to_data
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.testbeds import SLOT_IDS_ANNOTATION, TESTBED_ANNOTATION
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

    def test_finished_job_cannot_be_claimed(self) -> None:
        """A completed job is not run again."""
        job = Job()
        job.observe("completed")
        with pytest.raises(Rejected, match="already completed"):
            job.claim()


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

    @pytest.mark.parametrize("steps", [0, 1, 2, 3, 4])
    def test_completed_from_any_earlier_state(self, steps: int) -> None:
        """An application observed completed finishes the job from any earlier state: ready,
        in queue, submitted, scheduled or running (the controller may have been down)."""
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

    def test_failure_is_terminal(self) -> None:
        """A failed application fails the job; later observations change nothing."""
        job = submitted()
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

    def test_release_of_a_completed_job_keeps_it_completed(self) -> None:
        """Releasing a finished job frees it but keeps its outcome."""
        job = submitted()
        job.observe("completed")
        job(bj.ReleaseJob("j1", "s1", at=at(4)))
        assert (job.state.status, job.state.holder) == ("completed", None)


class TestApplication:
    def test_spark_application(self) -> None:
        """The Spark executors get slot-sized requests, one per slot, priority, scheduler and
        slot ids."""
        manifest = bj.application_manifest(submitted().state, namespace="jobs")
        assert manifest is not None
        spec = manifest["spec"]
        assert isinstance(spec, dict)
        executor = spec["executor"]
        assert manifest["kind"] == "SparkApplication"
        assert manifest["metadata"] == {"name": "j1-app", "namespace": "jobs"}
        assert (executor["instances"], executor["coreRequest"], executor["memory"]) == (
            2,
            "1000m",
            "2048Mi",
        )
        assert (executor["priorityClassName"], executor["schedulerName"]) == (
            "batch-high",
            "fleetledger",
        )
        assert executor["annotations"] == {SLOT_IDS_ANNOTATION: "0,2", TESTBED_ANNOTATION: "bed"}
        assert spec["arguments"] == ["--in", "hdfs://d"]

    def test_flink_application(self) -> None:
        """The Flink task managers get the same slot-derived settings."""
        job = Job("flink")
        job.claim()
        job.request()
        manifest = bj.application_manifest(job.state, namespace="jobs")
        assert manifest is not None
        spec = manifest["spec"]
        assert isinstance(spec, dict)
        task_manager = spec["taskManager"]
        assert manifest["kind"] == "FlinkCluster"
        assert task_manager["replicas"] == 2
        assert task_manager["resources"] == {"requests": {"cpu": "1000m", "memory": "2048Mi"}}
        assert task_manager["schedulerName"] == "fleetledger"
        assert task_manager["annotations"][SLOT_IDS_ANNOTATION] == "0,2"
        terms = task_manager["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == ["n1"]

    def test_no_application_before_a_request(self) -> None:
        """A queued job has no application to build."""
        job = Job()
        job.claim()
        assert bj.application_manifest(job.state, namespace="jobs") is None


_COMMANDS = st.sampled_from(
    [
        *("claim_s1", "claim_s2", "request_s1", "request_s2", "release_s1", "release_s2"),
        *("pending", "scheduled", "running", "completed", "failed", "absent"),
    ]
)


class TestInvariants:
    @settings(max_examples=150, deadline=None)
    @given(st.lists(_COMMANDS, max_size=15))
    def test_holder_and_application_stay_consistent(self, commands: list[str]) -> None:
        """Whatever happens, a job with an application has a holder and a replication equal to
        its slot count, and a finished job never becomes unfinished again."""
        job = Job()
        finished = False
        for i, name in enumerate(commands):
            seconds = i + 1
            try:
                if name.startswith("claim"):
                    job.claim(name[-2:], seconds)
                elif name.startswith("request"):
                    job.request(name[-2:], seconds)
                elif name.startswith("release"):
                    job(bj.ReleaseJob("j1", name[-2:], at=at(seconds)))
                else:
                    job.observe(name, seconds)  # type: ignore[arg-type]
            except Rejected:
                pass
            state = job.state
            if state.status in ("submitted", "scheduled", "running"):
                assert state.holder is not None and state.application is not None
                assert state.application.replication == len(state.application.request.slot_ids)
            assert not (finished and state.status not in ("completed", "failed"))
            finished = state.status in ("completed", "failed")


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
