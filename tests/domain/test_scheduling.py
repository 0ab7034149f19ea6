"""The scheduling: acquire, the strategies, confirmation, completion, release and extension."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.codec import from_data, to_data
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.testbeds import batch_job as bj
from fleetledger.domain.testbeds import scheduling as sc
from fleetledger.domain.testbeds import testbed as tb

T0 = datetime(2025, 1, 1, tzinfo=UTC)
KNOWN_QUEUE = ("j2", "j1", "j1", "j2", "j1", "j2", "j1", "j2")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def as_dict(assignments: tuple[sc.Assignment, ...]) -> dict[str, tuple[int, ...]]:
    return {a.job: a.slot_ids for a in assignments}


class Scheduling:
    """One scheduling stream driven through commands."""

    def __init__(
        self,
        mode: sc.Mode = "queue",
        queue: tuple[str, ...] = (),
        items: tuple[sc.SlotItem, ...] = (),
        name: str = "s1",
    ) -> None:
        self.state = sc.initial_state()
        self.clock = 0
        self(sc.CreateScheduling(name, "bed", mode, queue, items, at=self.tick()))

    def tick(self) -> datetime:
        self.clock += 1
        return at(self.clock)

    def __call__(self, command: sc.SchedulingCommand) -> list[sc.SchedulingEvent]:
        events = sc.decide(self.state, command)
        for event in events:
            self.state = sc.evolve(self.state, event)
        return events

    def grant_all(self) -> list[sc.SchedulingEvent]:
        jobs, testbed = sc.pending_claims(self.state)
        return self(sc.RecordClaimsGranted(jobs, testbed, at=self.tick()))

    def assign(self, free: tuple[int, ...]) -> list[sc.SchedulingEvent]:
        return self(sc.AssignSlots(free, at=self.tick()))

    def observe(self, statuses: Mapping[str, bj.JobStatus]) -> list[sc.SchedulingEvent]:
        return self(sc.ObserveJobs(statuses, at=self.tick()))


def running(queue: tuple[str, ...] = ("j2", "j1", "j2", "j1")) -> Scheduling:
    s = Scheduling("queue", queue)
    s.grant_all()
    return s


class TestSurface:
    def test_stream_name(self) -> None:
        """One stream per scheduling."""
        assert sc.stream_name("s1") == "scheduling-s1"


class TestQueueStrategy:
    def test_known_result(self) -> None:
        """[j2,j1,j1,j2,j1,j2,j1,j2] over free slots 0–7 puts j2 on 0,3,5,7 and j1 on 1,2,4,6."""
        assert as_dict(sc.queue_assignments(KNOWN_QUEUE, range(8))) == {
            "j2": (0, 3, 5, 7),
            "j1": (1, 2, 4, 6),
        }

    def test_known_result_with_one_more_j2_waits_while_index_8_can_come_free(self) -> None:
        """One more j2 needs index 8: while a ninth slot can come free, j2 (and the queue behind
        it) waits for its positions, as the original does."""
        assert sc.queue_assignments((*KNOWN_QUEUE, "j2"), range(8), capacity=9) == ()

    def test_known_result_with_one_more_j2_on_eight_slots_starts(self) -> None:
        """On a testbed of eight slots index 8 never exists: rather than wait for ever, j2 takes
        its slots 0, 3, 5, 7 and the lowest free slot left, 1; j1 waits for slots."""
        assert as_dict(sc.queue_assignments((*KNOWN_QUEUE, "j2"), range(8), capacity=8)) == {
            "j2": (0, 1, 3, 5, 7)
        }

    def test_an_interleaved_queue_starts_its_first_job(self) -> None:
        """[a, b, a, b] over three free slots: a fits (2 of 3) and takes the slots at its indexes
        0 and 2; b (2 more) does not fit yet."""
        assert as_dict(sc.queue_assignments(("a", "b", "a", "b"), (0, 1, 2), capacity=3)) == {
            "a": (0, 2)
        }

    def test_an_alternating_queue_longer_than_the_testbed_starts(self) -> None:
        """[a, b, a, b, a, b] on four slots: a's third index (4) never exists, so a starts on its
        indexes 0 and 2 and the lowest slot left, 1."""
        queue = ("a", "b", "a", "b", "a", "b")
        assert as_dict(sc.queue_assignments(queue, range(4), capacity=4)) == {"a": (0, 1, 2)}

    def test_positions_past_the_free_slots_wait_while_they_can_come_free(self) -> None:
        """[a, b, b, a] with three of four slots free: a's index 3 comes free later, so it waits
        for it; on a testbed of three slots it starts now."""
        queue = ("a", "b", "b", "a")
        assert sc.queue_assignments(queue, (0, 1, 2), capacity=4) == ()
        assert as_dict(sc.queue_assignments(queue, (0, 1, 2), capacity=3)) == {"a": (0, 1)}

    def test_later_jobs_read_their_indexes_once_earlier_ones_left(self) -> None:
        """The jobs of the runnable prefix start in turn over what the earlier ones left: after a
        takes 0 and 2, [b, c] reads indexes 0 and 1 over the free slots 1 and 3."""
        assert as_dict(sc.queue_assignments(("a", "b", "a", "c"), range(4))) == {
            "a": (0, 2),
            "b": (1,),
            "c": (3,),
        }

    def test_free_slots_are_taken_in_ascending_order(self) -> None:
        """Indices map onto the sorted free slots, not the order they were given in."""
        assert as_dict(sc.queue_assignments(("a", "b", "a"), [9, 4, 6])) == {
            "a": (4, 9),
            "b": (6,),
        }

    def test_longest_runnable_prefix(self) -> None:
        """Jobs that fit whole start; the first that does not ends the prefix."""
        assignments = sc.queue_assignments(("a", "b", "b", "c", "c"), range(4))
        assert as_dict(assignments) == {"a": (0,), "b": (1, 2)}

    def test_scenario_queue(self) -> None:
        """[j2,j1,j2,j1] over 0–3 puts j2 on 0,2 and j1 on 1,3."""
        assert as_dict(sc.queue_assignments(("j2", "j1", "j2", "j1"), range(4))) == {
            "j2": (0, 2),
            "j1": (1, 3),
        }

    @settings(max_examples=200, deadline=None)
    @given(
        queue=st.lists(st.sampled_from("abcde"), max_size=12),
        free=st.sets(st.integers(0, 20), max_size=12),
    )
    def test_a_job_starts_only_with_exactly_its_replication(
        self, queue: list[str], free: set[int]
    ) -> None:
        """Every started job gets exactly as many distinct free slots as its queue count, and no
        slot goes to two jobs."""
        assignments = sc.queue_assignments(queue, free)
        counts = Counter(queue)
        given_out = [s for a in assignments for s in a.slot_ids]
        assert len(given_out) == len(set(given_out)) and set(given_out) <= free
        assert all(len(a.slot_ids) == counts[a.job] for a in assignments)


class TestSlotStrategy:
    ITEMS = (
        sc.SlotItem("a", (0, 1)),
        sc.SlotItem("b", (1, 2)),
        sc.SlotItem("c", (3,)),
    )

    def test_strict_stops_at_the_first_job_that_cannot_start(self) -> None:
        """Strict: b's slot 1 is taken by a, so b and everything after it wait."""
        assert as_dict(sc.slot_assignments(self.ITEMS, range(4), strict=True)) == {"a": (0, 1)}

    def test_relaxed_skips_the_job_that_cannot_start(self) -> None:
        """Relaxed: b is skipped, c starts."""
        assert as_dict(sc.slot_assignments(self.ITEMS, range(4), strict=False)) == {
            "a": (0, 1),
            "c": (3,),
        }

    def test_slots_must_all_be_free(self) -> None:
        """A job whose slots are not all free does not start."""
        assert sc.slot_assignments(self.ITEMS[:1], (0, 2), strict=False) == ()

    @settings(max_examples=200, deadline=None)
    @given(
        items=st.lists(
            st.sets(st.integers(0, 9), min_size=1, max_size=4).map(lambda s: tuple(sorted(s))),
            max_size=6,
        ),
        free=st.sets(st.integers(0, 9)),
        strict=st.booleans(),
    )
    def test_no_slot_is_given_twice(
        self, items: list[tuple[int, ...]], free: set[int], strict: bool
    ) -> None:
        """Started jobs get exactly their listed slots, all free, none shared."""
        slot_items = [sc.SlotItem(f"j{i}", ids) for i, ids in enumerate(items)]
        assignments = sc.slot_assignments(slot_items, free, strict=strict)
        wanted = {i.job: i.slot_ids for i in slot_items}
        given_out = [s for a in assignments for s in a.slot_ids]
        assert len(given_out) == len(set(given_out)) and set(given_out) <= free
        assert all(a.slot_ids == wanted[a.job] for a in assignments)


class TestCreate:
    def test_created_scheduling_acquires(self) -> None:
        """A new scheduling starts in acquire with its jobs in order."""
        s = Scheduling("queue", ("j2", "j1", "j2"))
        assert (s.state.phase, s.state.jobs) == ("acquire", ("j2", "j1"))
        assert sc.pending_claims(s.state) == (("j2", "j1"), True)

    def test_queue_mode_refuses_slot_items(self) -> None:
        """Each mode takes its own kind of job list."""
        with pytest.raises(InvalidCommand, match="queue of job names"):
            Scheduling("queue", items=(sc.SlotItem("a", (0,)),))

    def test_a_job_twice_in_slot_mode_is_invalid(self) -> None:
        """A job runs once per scheduling."""
        with pytest.raises(InvalidCommand, match="already in the scheduling"):
            Scheduling("slots_strict", items=(sc.SlotItem("a", (0,)), sc.SlotItem("a", (1,))))

    def test_same_creation_again_changes_nothing(self) -> None:
        """Repeating the creation is a no-op."""
        s = Scheduling("queue", ("a",))
        assert s(sc.CreateScheduling("s1", "bed", "queue", ("a",), at=at(50))) == []

    def test_commands_before_creation_are_refused(self) -> None:
        """A scheduling that does not exist decides nothing."""
        with pytest.raises(Rejected, match="create it first"):
            sc.decide(sc.initial_state(), sc.ReleaseScheduling(at=at(0)))


class TestAcquire:
    def test_all_claims_granted_moves_to_submission(self) -> None:
        """With every job and the testbed held, the scheduling submits."""
        s = Scheduling("queue", ("a", "b"))
        [event] = s.grant_all()
        assert event == sc.ClaimsGranted(("a", "b"), True, at(2))
        assert s.state.phase == "submission"

    def test_partial_claims_stay_in_acquire(self) -> None:
        """Until everything is held, the scheduling keeps acquiring."""
        s = Scheduling("queue", ("a", "b"))
        s(sc.RecordClaimsGranted(("a",), False, at=s.tick()))
        assert s.state.phase == "acquire"
        assert sc.pending_claims(s.state) == (("b",), True)

    def test_conflict_releases_everything_held(self) -> None:
        """A refused claim in acquire gives back what is held, and the scheduling waits."""
        s = Scheduling("queue", ("a", "b"))
        s(sc.RecordClaimsGranted(("a",), True, at=s.tick()))
        events = s(sc.RecordClaimConflict("b", "held by s0", at=s.tick()))
        assert events == [
            sc.ClaimConflicted("b", "held by s0", at(3)),
            sc.HoldingsReleased(("a",), True, at(3)),
        ]
        assert (s.state.phase, s.state.held_jobs, s.state.holds_testbed) == (
            "acquire",
            frozenset(),
            False,
        )
        assert sc.pending_claims(s.state) == (("a", "b"), True)

    def test_conflict_holding_nothing_releases_nothing(self) -> None:
        """A conflict with nothing held is only recorded."""
        s = Scheduling("queue", ("a",))
        assert s(sc.RecordClaimConflict("a", "held", at=s.tick())) == [
            sc.ClaimConflicted("a", "held", at(2))
        ]

    def test_granting_a_stranger_is_invalid(self) -> None:
        """Only the scheduling's own jobs can be granted."""
        s = Scheduling("queue", ("a",))
        with pytest.raises(InvalidCommand, match="not in this scheduling"):
            s(sc.RecordClaimsGranted(("zz",), True, at=s.tick()))

    def test_granting_again_changes_nothing(self) -> None:
        """A grant for what is already held is a no-op (a retried append)."""
        s = running()
        assert s(sc.RecordClaimsGranted(("j1", "j2"), True, at=s.tick())) == []


class TestSharedJobs:
    def test_two_schedulings_sharing_a_job_never_deadlock(self) -> None:
        """The later of two schedulings sharing a job waits in acquire, holding nothing, and
        acquires once the first releases."""
        job = bj.evolve(bj.initial_state(), bj.JobDefined("j", "spark", "i", "m", (), T0))
        bed = tb.evolve(tb.initial_state(), tb.TestbedDefined("bed", "l", 1, 1, 1, T0))
        schedulings = {n: Scheduling("queue", ("j",), name=n) for n in ("s1", "s2")}

        def acquire(name: str) -> bool:
            # What the host does: decide every claim, append them all with the grant, or
            # record the conflict.
            nonlocal job, bed
            s = schedulings[name]
            try:
                job_events = bj.decide(job, bj.ClaimJob("j", name, at=s.tick()))
                bed_events = tb.decide(bed, tb.ClaimTestbed(name, at=s.tick()))
            except Rejected as e:
                s(sc.RecordClaimConflict("j", e.reason, at=s.tick()))
                return False
            for job_event in job_events:
                job = bj.evolve(job, job_event)
            for bed_event in bed_events:
                bed = tb.evolve(bed, bed_event)
            s.grant_all()
            return True

        assert acquire("s1")
        assert not acquire("s2")
        second = schedulings["s2"].state
        assert second.phase == "acquire" and not second.held_jobs
        [released] = schedulings["s1"](sc.ReleaseScheduling(at=at(90)))
        assert isinstance(released, sc.SchedulingReleased) and released.jobs == ("j",)
        job = bj.evolve(job, *bj.decide(job, bj.ReleaseJob("j", "s1", at=at(90))))
        bed = tb.evolve(bed, *tb.decide(bed, tb.ReleaseTestbed("s1", at=at(90))))
        assert acquire("s2")
        assert schedulings["s2"].state.phase == "submission"


class TestSubmission:
    def test_assignment_moves_to_confirmation(self) -> None:
        """Started jobs leave the queue and await confirmation."""
        s = running()
        [event] = s.assign((0, 1, 2, 3))
        assert isinstance(event, sc.JobsAssigned)
        assert as_dict(event.assignments) == {"j2": (0, 2), "j1": (1, 3)}
        assert (s.state.phase, s.state.queue, s.state.round) == ("confirmation", (), ("j2", "j1"))

    def test_nothing_runnable_waits(self) -> None:
        """Too few free slots: nothing is decided, the scheduling waits in submission."""
        s = running()
        assert s.assign((0,)) == []
        assert s.state.phase == "submission"

    def test_an_interleaved_queue_starts_what_fits(self) -> None:
        """[j2, j1, j2, j1] with three free slots starts j2 on the slots at its indexes; j1
        stays queued."""
        s = running()
        [event] = s.assign((0, 1, 2))
        assert isinstance(event, sc.JobsAssigned)
        assert as_dict(event.assignments) == {"j2": (0, 2)}
        assert s.state.queue == ("j1", "j1")

    def test_assign_outside_submission_is_refused(self) -> None:
        """Slots are assigned only in submission."""
        s = Scheduling("queue", ("a",))
        with pytest.raises(Rejected, match="in acquire"):
            s.assign((0,))

    def test_confirmation_waits_for_every_job_of_the_round(self) -> None:
        """Until every started job is scheduled the scheduling stays in confirmation."""
        s = running(("a", "b", "c", "c"))
        s.assign((0, 1))
        assert s.observe({"a": "scheduled", "b": "submitted"}) == []
        [event] = s.observe({"a": "running", "b": "scheduled"})
        assert event == sc.SubmissionConfirmed(("a", "b"), at(s.clock))
        assert (s.state.phase, s.state.queue) == ("submission", ("c", "c"))

    def test_rounds_continue_until_the_queue_is_empty(self) -> None:
        """Submission ⇄ confirmation repeats; an empty queue leads to awaiting completion."""
        s = running(("a", "b", "b"))
        s.assign((0,))
        s.observe({"a": "running"})
        s.assign((1, 2))
        s.observe({"a": "running", "b": "scheduled"})
        assert s.state.phase == "awaiting_completion"
        assert as_dict(s.state.assignments) == {"a": (0,), "b": (1, 2)}

    def test_strict_slot_mode_in_the_scheduling(self) -> None:
        """A strict slot-based scheduling starts up to the first blocked item."""
        items = (sc.SlotItem("a", (0,)), sc.SlotItem("b", (5,)), sc.SlotItem("c", (1,)))
        s = Scheduling("slots_strict", items=items)
        s.grant_all()
        [event] = s.assign((0, 1))
        assert isinstance(event, sc.JobsAssigned)
        assert as_dict(event.assignments) == {"a": (0,)}
        assert s.state.items == items[1:]

    def test_relaxed_slot_mode_in_the_scheduling(self) -> None:
        """A relaxed slot-based scheduling skips blocked items and keeps them for later."""
        items = (sc.SlotItem("a", (0,)), sc.SlotItem("b", (5,)), sc.SlotItem("c", (1,)))
        s = Scheduling("slots_relaxed", items=items)
        s.grant_all()
        s.assign((0, 1))
        assert s.state.items == (items[1],)


class TestCompletion:
    def test_completed_when_every_job_finished(self) -> None:
        """All jobs finished: completed, with which ones failed."""
        s = running(("a", "b"))
        s.assign((0, 1))
        s.observe({"a": "running", "b": "running"})
        assert s.observe({"a": "completed", "b": "running"}) == []
        [event] = s.observe({"a": "completed", "b": "failed"})
        assert event == sc.SchedulingCompleted(("a",), ("b",), at(s.clock))
        assert s.state.phase == "completed"

    def test_confirmation_and_completion_in_one_observation(self) -> None:
        """Jobs that already finished when first seen confirm and complete at once (the
        controller may have been down)."""
        s = running(("a",))
        s.assign((0,))
        events = s.observe({"a": "completed"})
        assert [type(e) for e in events] == [sc.SubmissionConfirmed, sc.SchedulingCompleted]

    def test_release_finishes(self) -> None:
        """Released, the scheduling is finished and lets go of its jobs and the testbed."""
        s = running(("a",))
        assert s(sc.ReleaseScheduling(at=s.tick())) == [
            sc.SchedulingReleased(("a",), True, at(s.clock))
        ]
        assert s.state.phase == "finished"
        assert s(sc.ReleaseScheduling(at=s.tick())) == []

    def test_finished_scheduling_refuses_commands(self) -> None:
        """A finished scheduling takes no more work."""
        s = running(("a",))
        s(sc.ReleaseScheduling(at=s.tick()))
        with pytest.raises(Rejected, match="finished"):
            s(sc.ExtendQueue(("b",), at=s.tick()))


class TestOnlineExtension:
    def test_extending_a_running_scheduling(self) -> None:
        """Jobs added to a scheduling awaiting completion are claimed, then started."""
        s = running(("a",))
        s.assign((0,))
        s.observe({"a": "running"})
        before = s.state.phase
        s(sc.ExtendQueue(("b", "b"), at=s.tick()))
        assert (before, s.state.phase) == ("awaiting_completion", "submission")
        assert sc.pending_claims(s.state) == (("b",), False)
        assert s.assign((1, 2)) == []
        s.grant_all()
        [event] = s.assign((1, 2))
        assert isinstance(event, sc.JobsAssigned) and as_dict(event.assignments) == {"b": (1, 2)}

    def test_conflict_after_acquire_releases_nothing(self) -> None:
        """A refused claim on an added job releases nothing: the other jobs may be running."""
        s = running(("a",))
        s(sc.ExtendQueue(("b",), at=s.tick()))
        events = s(sc.RecordClaimConflict("b", "held", at=s.tick()))
        assert [type(e) for e in events] == [sc.ClaimConflicted]
        assert s.state.held_jobs == {"a"}

    def test_a_job_already_in_the_scheduling_cannot_be_added(self) -> None:
        """Extension adds new jobs only."""
        s = running(("a",))
        with pytest.raises(InvalidCommand, match="already in the scheduling"):
            s(sc.ExtendQueue(("a",), at=s.tick()))


class TestInvariants:
    @settings(max_examples=100, deadline=None)
    @given(
        queue=st.lists(st.sampled_from("abcd"), min_size=1, max_size=10),
        rounds=st.lists(st.sets(st.integers(0, 9)), max_size=8),
    )
    def test_each_job_starts_once_with_exactly_its_replication(
        self, queue: list[str], rounds: list[set[int]]
    ) -> None:
        """Over any rounds of free slots, every job starts at most once, on exactly as many
        slots as its queue count, and is either started or still queued."""
        s = Scheduling("queue", tuple(queue))
        s.grant_all()
        for free in rounds:
            if s.state.phase == "submission":
                s.assign(tuple(sorted(free)))
            elif s.state.phase == "confirmation":
                s.observe(dict.fromkeys(s.state.round, "running"))
        counts = Counter(queue)
        started = [a.job for a in s.state.assignments]
        assert len(started) == len(set(started))
        assert all(len(a.slot_ids) == counts[a.job] for a in s.state.assignments)
        assert set(started) | set(s.state.queue) == set(queue)
        assert not set(started) & set(s.state.queue)


def run_to_the_end(queue: tuple[str, ...], slots: int) -> Scheduling:
    """Drive a queue-based scheduling on a testbed of ``slots`` slots where every started job
    runs for one round and then completes, freeing its slots."""
    s = Scheduling("queue", queue)
    s.grant_all()
    everything = tuple(range(slots))
    for _ in range(2 * len(queue) + 2):
        if s.state.phase == "submission":
            s(sc.AssignSlots(everything, at=s.tick(), usable_slots=everything))
        started = {a.job for a in s.state.assignments}
        s.observe({j: "running" if j in started else "in_queue" for j in s.state.jobs})
        s.observe({j: "completed" if j in started else "in_queue" for j in s.state.jobs})
    return s


class TestNeverStuck:
    @settings(max_examples=150, deadline=None)
    @given(
        queue=st.lists(st.sampled_from("abcd"), min_size=1, max_size=12).map(tuple),
        slots=st.integers(1, 8),
    )
    def test_every_slot_free_and_a_queue_left_is_never_a_dead_end(
        self, queue: tuple[str, ...], slots: int
    ) -> None:
        """Whatever the queue and the testbed's size, the scheduling runs every job that fits
        the testbed and finishes; a job needing more slots than the testbed has is recorded as
        blocked instead of waiting silently."""
        s = run_to_the_end(queue, slots)
        too_big = {j for j, n in Counter(queue).items() if n > slots}
        if too_big:
            assert s.state.blocked is not None and s.state.blocked.job in too_big
            assert s.state.phase == "submission"
        else:
            assert s.state.phase == "completed", (s.state.phase, s.state.queue)
            assert s.state.blocked is None

    def test_a_job_bigger_than_the_testbed_is_recorded_as_blocked(self) -> None:
        """Five copies of a on four slots: the scheduling records why it cannot go on, once."""
        s = running(("a",) * 5)
        [event] = s(sc.AssignSlots((0, 1, 2, 3), at=s.tick(), usable_slots=(0, 1, 2, 3)))
        assert isinstance(event, sc.SchedulingBlocked) and event.job == "a"
        assert "needs 5 slots but testbed bed has 4" in event.reason
        assert s(sc.AssignSlots((0, 1, 2, 3), at=s.tick(), usable_slots=(0, 1, 2, 3))) == []

    def test_the_block_is_lifted_when_the_testbed_grows(self) -> None:
        """Once the testbed has the slots, the job starts and the record is lifted."""
        s = running(("a",) * 5)
        s(sc.AssignSlots((0, 1, 2, 3), at=s.tick(), usable_slots=(0, 1, 2, 3)))
        events = s(sc.AssignSlots(tuple(range(6)), at=s.tick(), usable_slots=tuple(range(6))))
        assert [type(e) for e in events] == [sc.JobsAssigned, sc.SchedulingUnblocked]
        assert s.state.blocked is None

    def test_a_slot_item_naming_a_slot_the_testbed_lacks_is_blocked(self) -> None:
        """Slot-based: an item naming slot 9 on a testbed of slots 0–3 can never start."""
        s = Scheduling("slots_relaxed", items=(sc.SlotItem("a", (0,)), sc.SlotItem("b", (9,))))
        s.grant_all()
        events = s(sc.AssignSlots((0, 1, 2, 3), at=s.tick(), usable_slots=(0, 1, 2, 3)))
        assert [type(e) for e in events] == [sc.JobsAssigned, sc.SchedulingBlocked]
        assert s.state.blocked is not None and "names slots 9" in s.state.blocked.reason


class TestLostApplications:
    def test_a_started_job_seen_in_queue_again_is_requeued_at_its_place(self) -> None:
        """A job whose application disappeared is in_queue again: the scheduling puts it back
        in its queue, where it stood, and forgets its slots."""
        s = running(("a", "b", "a", "c"))
        s.assign((0, 1, 2, 3))
        assert as_dict(s.state.assignments) == {"a": (0, 2), "b": (1,), "c": (3,)}
        s.observe({"a": "running", "b": "running", "c": "running"})

        [event] = s.observe({"a": "in_queue", "b": "running", "c": "running"})

        assert isinstance(event, sc.JobRequeued)
        assert (event.job, event.at) == ("a", at(s.clock))
        assert (s.state.phase, s.state.queue) == ("submission", ("a", "a"))
        assert as_dict(s.state.assignments) == {"b": (1,), "c": (3,)}
        [again] = s.assign((0, 2))
        assert isinstance(again, sc.JobsAssigned) and as_dict(again.assignments) == {"a": (0, 2)}

    def test_a_lost_job_of_the_round_ends_the_confirmation(self) -> None:
        """Losing the only job awaiting confirmation sends the scheduling back to submission."""
        s = running(("a",))
        s.assign((0,))
        events = s.observe({"a": "in_queue"})
        assert [type(e) for e in events] == [sc.JobRequeued]
        assert (s.state.phase, s.state.round, s.state.queue) == ("submission", (), ("a",))

    def test_unstarted_jobs_in_queue_are_not_requeued(self) -> None:
        """A job that never started is simply queued: nothing to record."""
        s = running(("a", "b"))
        s.assign((0,))
        assert s.observe({"a": "scheduled", "b": "in_queue"}) == [
            sc.SubmissionConfirmed(("a",), at(s.clock))
        ]


EVENTS = [
    sc.SchedulingCreated("s1", "bed", "slots_relaxed", (), (sc.SlotItem("a", (0, 1)),), T0),
    sc.ClaimsGranted(("a",), True, T0),
    sc.ClaimConflicted("a", "held by s0", T0),
    sc.HoldingsReleased(("a",), False, T0),
    sc.JobsAssigned((sc.Assignment("a", (0, 1)),), T0),
    sc.SubmissionConfirmed(("a",), T0),
    sc.SchedulingCompleted(("a",), (), T0),
    sc.QueueExtended(("b", "b"), (), T0),
    sc.SchedulingReleased(("a",), True, T0),
]


class TestCodec:
    @pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
    def test_round_trip(self, event: sc.SchedulingEvent) -> None:
        """Every scheduling event survives the codec under a ``scheduling.`` name."""
        name, version, data = to_data(event)
        assert name.startswith("scheduling.") and version == 1
        assert from_data(name, version, data) == event
