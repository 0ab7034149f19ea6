"""The Grouper decider: when batches seal, what they hold, and the request/name bookkeeping."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.machines.grouper import (
    BatchMachine,
    BatchOutcomesRecorded,
    BatchSealed,
    GrouperCommand,
    GrouperConfig,
    GrouperEvent,
    GrouperState,
    MachineRequested,
    RecordBatchOutcomes,
    RequestMachine,
    Shutdown,
    Tick,
    _PersistentMap,
    decide,
    evolve,
    initial_state,
    next_deadline,
    pending_batches,
    pending_request_count,
    request_status,
    sealed_batch_id,
)
from fleetledger.domain.template import MachineTemplate, template_hash

T0 = datetime(2025, 1, 1, tzinfo=UTC)
D4 = MachineTemplate(vm_size="Standard_D4s_v5")
D8 = MachineTemplate(vm_size="Standard_D8s_v5")
E16 = MachineTemplate(vm_size="Standard_E16s_v5")
CONFIG = GrouperConfig(
    idle_timeout=timedelta(milliseconds=100),
    max_timeout=timedelta(milliseconds=500),
    max_batch_size=3,
)
US = timedelta(microseconds=1)


def ms(n: float) -> datetime:
    return T0 + timedelta(milliseconds=n)


def request(
    n: int,
    at: datetime,
    template: MachineTemplate = D4,
    *,
    skip: bool = False,
    name: str | None = None,
    zones: tuple[str, ...] = (),
    tags: tuple[tuple[str, str], ...] = (),
) -> RequestMachine:
    return RequestMachine(
        f"r{n}",
        name or f"m{n}",
        template,
        zones=zones,
        tags=tags,
        skip_batching=skip,
        at=at,
    )


class Run:
    """A grouper driven through commands, keeping every event."""

    def __init__(self, config: GrouperConfig = CONFIG) -> None:
        self.config = config
        self.state: GrouperState = initial_state()
        self.events: list[GrouperEvent] = []

    def __call__(self, *commands: GrouperCommand) -> list[GrouperEvent]:
        produced: list[GrouperEvent] = []
        for command in commands:
            new = decide(self.state, command, self.config)
            for event in new:
                self.state = evolve(self.state, event)
            produced.extend(new)
        self.events.extend(produced)
        return produced

    @property
    def sealed(self) -> list[BatchSealed]:
        return sealed(self.events)


def sealed(events: Iterable[GrouperEvent]) -> list[BatchSealed]:
    return [e for e in events if isinstance(e, BatchSealed)]


class TestGrouperConfig:
    def test_default_is_the_original(self) -> None:
        """The defaults are the original's: idle 1 s, max 5 s, 50 per batch."""
        config = GrouperConfig.default()
        assert (config.idle_timeout, config.max_timeout, config.max_batch_size) == (
            timedelta(seconds=1),
            timedelta(seconds=5),
            50,
        )

    @pytest.mark.parametrize(
        ("idle", "hard", "size", "hint"),
        [
            (timedelta(0), timedelta(1), 5, "idle_timeout must be a positive"),
            (timedelta(1), -timedelta(1), 5, "max_timeout must be a positive"),
            (timedelta(seconds=2), timedelta(seconds=1), 5, "raise max_timeout"),
            (timedelta(1), timedelta(1), 0, "max_batch_size must be a positive"),
            (timedelta(1), timedelta(1), True, "max_batch_size must be a positive"),
        ],
    )
    def test_invalid_config_says_how_to_fix_it(
        self, idle: timedelta, hard: timedelta, size: int, hint: str
    ) -> None:
        """A bad configuration is refused at construction with an actionable message."""
        with pytest.raises(InvalidCommand, match=hint):
            GrouperConfig(idle_timeout=idle, max_timeout=hard, max_batch_size=size)

    def test_idle_equal_to_max_is_allowed(self) -> None:
        """idle_timeout may equal max_timeout."""
        GrouperConfig(timedelta(1), timedelta(1), 1)


class TestFullSeal:
    def test_reaching_max_size_seals_in_the_same_decision(self) -> None:
        """The request that makes the batch full is in it, and the batch seals at once."""
        run = Run()
        run(request(1, ms(0)), request(2, ms(10)))
        events = run(request(3, ms(20)))
        assert [type(e) for e in events] == [MachineRequested, BatchSealed]
        batch = sealed(events)[0]
        assert batch.reason == "full"
        assert batch.request_ids == ("r1", "r2", "r3")
        assert batch.at == ms(20)

    def test_one_below_max_size_does_not_seal(self) -> None:
        """max_batch_size - 1 requests leave the batch pending."""
        run = Run()
        run(request(1, ms(0)), request(2, ms(10)))
        assert run.sealed == []
        assert pending_request_count(run.state) == 2

    def test_next_request_after_full_opens_a_new_batch(self) -> None:
        """Request max+1 opens a new batch with a new id instead of joining the sealed one."""
        run = Run()
        run(*(request(i, ms(i)) for i in range(1, 5)))
        (first,) = run.sealed
        (pending,) = pending_batches(run.state)
        assert pending.batch_id != first.batch_id
        assert tuple(pending.requests) == ("r4",)

    def test_batch_size_one_seals_every_request(self) -> None:
        """With max_batch_size 1 each request is its own full batch."""
        run = Run(GrouperConfig(timedelta(1), timedelta(1), 1))
        run(request(1, ms(0)), request(2, ms(0)))
        assert [b.request_ids for b in run.sealed] == [("r1",), ("r2",)]
        assert {b.reason for b in run.sealed} == {"full"}

    def test_sealed_batch_is_self_contained(self) -> None:
        """The sealed event carries template, hash and each machine's variations in order."""
        run = Run()
        run(
            request(1, ms(0), zones=("1",), tags=(("team", "a"),)),
            request(2, ms(1), zones=("2", "3")),
            request(3, ms(2), tags=(("b", "2"), ("a", "1"))),
        )
        (batch,) = run.sealed
        assert batch.template == D4
        assert batch.template_hash == template_hash(D4)
        assert batch.machines == (
            BatchMachine("r1", "m1", ("1",), (("team", "a"),)),
            BatchMachine("r2", "m2", ("2", "3"), ()),
            BatchMachine("r3", "m3", (), (("a", "1"), ("b", "2"))),
        )

    def test_variations_do_not_split_batches(self) -> None:
        """Requests differing only in name, zones and tags share one hash and one batch."""
        run = Run()
        events = run(
            request(1, ms(0), name="a", zones=("1",), tags=(("x", "1"),)),
            request(2, ms(1), name="b", zones=("2", "3")),
            request(3, ms(2), name="c", tags=(("y", "2"),)),
        )
        requested = [e for e in events if isinstance(e, MachineRequested)]
        assert len({(e.template_hash, e.batch_id) for e in requested}) == 1
        assert [b.request_ids for b in run.sealed] == [("r1", "r2", "r3")]

    def test_lowered_size_seals_an_over_full_batch_first(self) -> None:
        """A batch larger than a newly lowered max_batch_size seals (full) before anything else,
        in parts within the new limit."""
        run = Run(GrouperConfig(timedelta(seconds=1), timedelta(seconds=5), 10))
        run(*(request(i, ms(i)) for i in range(1, 5)))
        run.config = GrouperConfig(timedelta(seconds=1), timedelta(seconds=5), 3)
        events = run(request(9, ms(5)))
        parts = sealed(events)
        assert [(b.reason, b.request_ids) for b in parts] == [
            ("full", ("r1", "r2", "r3")),
            ("full", ("r4",)),
        ]
        assert tuple(pending_batches(run.state)[0].requests) == ("r9",)


class TestLoweredLimitAfterRestart:
    """12 requests pending under max 50 when the process stopped; it restarts with max 5."""

    def _restarted(self) -> Run:
        run = Run(GrouperConfig(timedelta(seconds=1), timedelta(seconds=5), 50))
        run(*(request(i, ms(i)) for i in range(1, 13)))
        run.config = GrouperConfig(timedelta(seconds=1), timedelta(seconds=5), 5)
        return run

    def test_the_pending_batch_is_sealed_in_parts_within_the_new_limit(self) -> None:
        """The 12 go out as 5, 5 and 2, in request order, all sealed full."""
        run = self._restarted()

        parts = sealed(run(Tick(ms(20))))

        assert [len(b.request_ids) for b in parts] == [5, 5, 2]
        assert [r for b in parts for r in b.request_ids] == [f"r{i}" for i in range(1, 13)]
        assert {b.reason for b in parts} == {"full"}
        assert pending_batches(run.state) == ()

    def test_the_first_part_keeps_the_batch_id_and_the_others_are_numbered(self) -> None:
        """Part ids are derived from the batch's, so replaying the log derives the same ones."""
        run = self._restarted()
        batch_id = pending_batches(run.state)[0].batch_id

        parts = sealed(run(Tick(ms(20))))

        assert [b.batch_id for b in parts] == [batch_id, f"{batch_id}.2", f"{batch_id}.3"]

    def test_requests_report_the_part_they_were_sealed_in(self) -> None:
        """request_status and sealed_batch_id name each request's part, not the pending batch."""
        run = self._restarted()
        parts = sealed(run(Tick(ms(20))))

        assert request_status(run.state, "r1") == ("sealed", parts[0].batch_id)
        assert request_status(run.state, "r7") == ("sealed", parts[1].batch_id)
        assert sealed_batch_id(run.state, "r12") == parts[2].batch_id
        assert sealed_batch_id(run.state, "nope") is None

    def test_outcomes_are_recorded_against_each_part(self) -> None:
        """A part's outcomes are accepted under its own id, and refused under another part's."""
        run = self._restarted()
        parts = sealed(run(Tick(ms(20))))

        recorded = run(RecordBatchOutcomes(parts[2].batch_id, ("r11",), ("r12",), at=ms(30)))

        assert [type(e) for e in recorded] == [BatchOutcomesRecorded]
        assert request_status(run.state, "r12") == ("failed", parts[2].batch_id)
        with pytest.raises(InvalidCommand, match="not part of batch"):
            run(RecordBatchOutcomes(parts[0].batch_id, ("r11",), at=ms(31)))

    def test_replaying_the_events_rebuilds_the_same_state(self) -> None:
        """evolve over the recorded parts gives the state decide left behind."""
        run = self._restarted()
        run(Tick(ms(20)))

        replayed = initial_state()
        for event in run.events:
            replayed = evolve(replayed, event)

        assert replayed == run.state


class TestIdleSeal:
    def test_exactly_idle_timeout_seals(self) -> None:
        """A tick exactly idle_timeout after the last request seals the batch as idle."""
        run = Run()
        run(request(1, ms(0)), request(2, ms(50)))
        events = run(Tick(ms(150)))
        assert [(b.reason, b.request_ids, b.at) for b in sealed(events)] == [
            ("idle", ("r1", "r2"), ms(150))
        ]

    def test_one_microsecond_before_idle_timeout_does_not_seal(self) -> None:
        """A tick 1 µs before the idle deadline seals nothing."""
        run = Run()
        run(request(1, ms(0)), request(2, ms(50)))
        assert run(Tick(ms(150) - US)) == []

    def test_a_new_request_restarts_the_idle_timer(self) -> None:
        """Idle counts from the last request, not the first."""
        run = Run()
        run(request(1, ms(0)), request(2, ms(90)))
        assert run(Tick(ms(100))) == []
        assert next_deadline(run.state, CONFIG) == ms(190)

    def test_late_tick_stamps_the_deadline(self) -> None:
        """A tick long after the deadline records the seal at the deadline itself."""
        run = Run()
        run(request(1, ms(0)))
        (batch,) = sealed(run(Tick(ms(400))))
        assert (batch.reason, batch.at) == ("idle", ms(100))

    def test_idle_is_per_template(self) -> None:
        """A request for another template does not keep a batch alive."""
        run = Run()
        run(request(1, ms(0), D4), request(2, ms(60), D8))
        events = run(Tick(ms(100)))
        assert [b.template for b in sealed(events)] == [D4]


class TestMaxSeal:
    def test_exactly_max_timeout_seals(self) -> None:
        """Requests arriving faster than idle keep the batch open until max_timeout exactly."""
        run = Run(GrouperConfig(timedelta(milliseconds=100), timedelta(milliseconds=250), 50))
        run(request(1, ms(0)), request(2, ms(90)), request(3, ms(180)))
        assert run(Tick(ms(250) - US)) == []
        (batch,) = sealed(run(Tick(ms(250))))
        assert (batch.reason, batch.at, batch.request_ids) == ("max", ms(250), ("r1", "r2", "r3"))

    def test_max_wins_a_tie_with_idle(self) -> None:
        """When the idle and max deadlines coincide the reason is max."""
        run = Run(GrouperConfig(timedelta(milliseconds=100), timedelta(milliseconds=300), 50))
        run(request(1, ms(0)), request(2, ms(90)), request(3, ms(180)), request(4, ms(200)))
        (batch,) = sealed(run(Tick(ms(300))))
        assert (batch.reason, batch.at, len(batch.machines)) == ("max", ms(300), 4)

    def test_idle_before_max_is_idle(self) -> None:
        """A batch that goes quiet before max_timeout seals as idle at its idle deadline."""
        run = Run()
        run(request(1, ms(0)), request(2, ms(100)))
        (batch,) = sealed(run(Tick(ms(1000))))
        assert (batch.reason, batch.at) == ("idle", ms(200))


class TestSkipSeal:
    def test_skip_request_seals_alone_at_once(self) -> None:
        """A skip-batching request is sealed in its own batch in the same decision."""
        run = Run()
        events = run(request(1, ms(0), skip=True))
        assert [type(e) for e in events] == [MachineRequested, BatchSealed]
        (batch,) = sealed(events)
        assert (batch.reason, batch.request_ids, batch.at) == ("skip", ("r1",), ms(0))
        assert pending_request_count(run.state) == 0

    def test_skip_request_leaves_the_pending_batch_alone(self) -> None:
        """A skip request of the same template neither joins nor seals the pending batch."""
        run = Run(GrouperConfig(timedelta(milliseconds=100), timedelta(milliseconds=500), 10))
        run(request(1, ms(0)), request(2, ms(10)))
        pending_id = pending_batches(run.state)[0].batch_id
        run(request(3, ms(20), skip=True))
        run(request(4, ms(30)))
        (pending,) = pending_batches(run.state)
        assert pending.batch_id == pending_id
        assert tuple(pending.requests) == ("r1", "r2", "r4")
        assert [b.reason for b in run.sealed] == ["skip"]

    def test_skip_request_does_not_extend_idle(self) -> None:
        """The pending batch's idle deadline ignores skip requests of its template."""
        run = Run()
        run(request(1, ms(0)), request(2, ms(90), skip=True))
        assert next_deadline(run.state, CONFIG) == ms(100)


class TestShutdown:
    def test_shutdown_seals_everything_pending(self) -> None:
        """Shutdown seals every pending batch with reason shutdown, each request exactly once."""
        run = Run()
        run(request(1, ms(0), D4), request(2, ms(10), D8), request(3, ms(20), D4))
        events = run(Shutdown(ms(30)))
        assert {b.reason for b in sealed(events)} == {"shutdown"}
        ids = [r for b in sealed(events) for r in b.request_ids]
        assert sorted(ids) == ["r1", "r2", "r3"]
        assert pending_request_count(run.state) == 0

    def test_shutdown_order_is_by_deadline_then_hash(self) -> None:
        """Batches seal in the order they would have fallen due."""
        run = Run()
        run(request(1, ms(0), D8), request(2, ms(5), E16), request(3, ms(10), D4))
        events = run(Shutdown(ms(20)))
        assert [b.template for b in sealed(events)] == [D8, E16, D4]

    def test_shutdown_keeps_the_reason_of_batches_already_due(self) -> None:
        """A batch already past its deadline at shutdown seals with its own reason and stamp."""
        run = Run()
        run(request(1, ms(0), D4), request(2, ms(90), D8))
        events = run(Shutdown(ms(150)))
        assert [(b.template, b.reason, b.at) for b in sealed(events)] == [
            (D4, "idle", ms(100)),
            (D8, "shutdown", ms(150)),
        ]

    def test_shutdown_with_nothing_pending_does_nothing(self) -> None:
        """Shutdown of an idle grouper produces no events."""
        assert Run()(Shutdown(ms(0))) == []


class TestTickOrder:
    def test_due_batches_seal_by_deadline(self) -> None:
        """One tick sealing several batches emits them by deadline."""
        run = Run()
        run(request(1, ms(0), D4), request(2, ms(10), E16), request(3, ms(20), D8))
        events = run(Tick(ms(1000)))
        # Template-hash order would be D8, D4, E16: deadline order wins.
        assert [(b.template, b.at) for b in sealed(events)] == [
            (D4, ms(100)),
            (E16, ms(110)),
            (D8, ms(120)),
        ]

    def test_equal_deadlines_seal_by_template_hash(self) -> None:
        """Batches due at the same instant seal in template-hash order."""
        run = Run()
        run(request(1, ms(0), D4), request(2, ms(0), D8), request(3, ms(0), E16))
        events = run(Tick(ms(100)))
        hashes = [b.template_hash for b in sealed(events)]
        assert hashes == sorted(hashes)
        assert len(hashes) == 3

    def test_tick_with_nothing_due_does_nothing(self) -> None:
        """A tick before any deadline returns no events."""
        run = Run()
        run(request(1, ms(0)))
        assert run(Tick(ms(50))) == []


class TestOverdueSealing:
    def test_request_after_a_deadline_seals_the_overdue_batch_first(self) -> None:
        """A request arriving after its template's idle deadline goes into a new batch."""
        run = Run()
        run(request(1, ms(0)))
        events = run(request(2, ms(400)))
        assert isinstance(events[0], BatchSealed)
        assert (events[0].reason, events[0].request_ids, events[0].at) == ("idle", ("r1",), ms(100))
        assert isinstance(events[1], MachineRequested)
        assert events[1].batch_id != events[0].batch_id

    def test_other_templates_overdue_batches_seal_too(self) -> None:
        """Any command seals every overdue batch, whatever its template."""
        run = Run()
        run(request(1, ms(0), D8))
        events = run(request(2, ms(200), D4))
        assert [type(e) for e in events] == [BatchSealed, MachineRequested]

    def test_events_do_not_depend_on_ticking(self) -> None:
        """With or without a punctual tick, the recorded seals are identical."""
        commands: list[GrouperCommand] = [
            request(1, ms(0)),
            request(2, ms(50)),
            request(3, ms(900)),
            Shutdown(ms(950)),
        ]
        ticked = Run()
        ticked(commands[0], commands[1], Tick(ms(150)), *commands[2:])
        unticked = Run()
        unticked(*commands)
        assert ticked.sealed == unticked.sealed


class TestIdempotentRequests:
    def test_repeated_request_is_a_no_op(self) -> None:
        """The same request id with the same content produces no events."""
        run = Run()
        run(request(1, ms(0)))
        assert run(request(1, ms(30))) == []
        assert pending_request_count(run.state) == 1

    def test_repeat_with_tags_in_another_order_is_the_same_request(self) -> None:
        """Tag order is not content."""
        run = Run()
        run(request(1, ms(0), tags=(("a", "1"), ("b", "2"))))
        assert run(request(1, ms(1), tags=(("b", "2"), ("a", "1")))) == []

    def test_repeat_after_sealing_is_a_no_op(self) -> None:
        """A retried request whose batch was already sealed does not create a second machine."""
        run = Run()
        run(request(1, ms(0)), Tick(ms(200)))
        assert run(request(1, ms(300))) == []

    def test_same_id_with_different_content_is_rejected(self) -> None:
        """Reusing a request id for another request is refused with advice."""
        run = Run()
        run(request(1, ms(0)))
        with pytest.raises(Rejected, match="use a new request id"):
            run(request(1, ms(1), D8))

    def test_same_id_with_other_skip_flag_is_rejected(self) -> None:
        """The skip flag is part of the request's content."""
        run = Run()
        run(request(1, ms(0)))
        with pytest.raises(Rejected):
            run(request(1, ms(1), skip=True))


class TestMachineNames:
    def test_name_pending_in_a_batch_is_rejected(self) -> None:
        """A second request for a machine name that is pending is refused and says so."""
        run = Run()
        run(request(1, ms(0), name="aks-1"))
        with pytest.raises(Rejected, match="'aks-1' is pending in batch"):
            run(request(2, ms(1), name="aks-1"))

    def test_name_being_created_is_rejected(self) -> None:
        """A name whose batch is sealed but has no outcome yet is refused."""
        run = Run()
        run(request(1, ms(0), name="aks-1", skip=True))
        with pytest.raises(Rejected, match="is being created by batch"):
            run(request(2, ms(1), name="aks-1"))

    def test_created_name_is_rejected(self) -> None:
        """A name that was created stays taken."""
        run = Run()
        (_, batch) = run(request(1, ms(0), name="aks-1", skip=True))
        run(RecordBatchOutcomes(batch.batch_id, created_request_ids=("r1",), at=ms(5)))
        with pytest.raises(Rejected, match="already created by request 'r1'"):
            run(request(2, ms(10), name="aks-1"))

    def test_failed_name_is_free_again(self) -> None:
        """After a failure the name may be requested again, under a new request id."""
        run = Run()
        (_, batch) = run(request(1, ms(0), name="aks-1", skip=True))
        run(RecordBatchOutcomes(batch.batch_id, failed_request_ids=("r1",), at=ms(5)))
        events = run(request(2, ms(10), name="aks-1"))
        assert isinstance(events[0], MachineRequested)
        assert request_status(run.state, "r1") == ("failed", batch.batch_id)

    def test_same_name_twice_in_one_burst_is_rejected(self) -> None:
        """Two requests cannot put one name into the same batch."""
        run = Run()
        run(request(1, ms(0), name="x"))
        with pytest.raises(Rejected):
            run(request(2, ms(0), name="x"))
        assert pending_request_count(run.state) == 1


class TestRecordBatchOutcomes:
    def sealed_run(self) -> tuple[Run, BatchSealed]:
        run = Run()
        run(request(1, ms(0)), request(2, ms(1)), request(3, ms(2)))
        return run, run.sealed[0]

    def test_records_created_and_failed(self) -> None:
        """Outcomes are recorded once and show in request_status."""
        run, batch = self.sealed_run()
        events = run(
            RecordBatchOutcomes(batch.batch_id, ("r1", "r3"), ("r2",), at=ms(10)),
        )
        assert events == [BatchOutcomesRecorded(batch.batch_id, ("r1", "r3"), ("r2",), ms(10))]
        assert request_status(run.state, "r2") == ("failed", batch.batch_id)
        assert request_status(run.state, "r3") == ("created", batch.batch_id)

    def test_partial_then_rest(self) -> None:
        """Outcomes may arrive a few at a time; repeats are dropped."""
        run, batch = self.sealed_run()
        run(RecordBatchOutcomes(batch.batch_id, ("r1",), at=ms(10)))
        events = run(RecordBatchOutcomes(batch.batch_id, ("r1", "r2"), ("r3",), at=ms(11)))
        assert events == [BatchOutcomesRecorded(batch.batch_id, ("r2",), ("r3",), ms(11))]

    def test_repeat_is_a_no_op(self) -> None:
        """Recording the same outcomes twice changes nothing."""
        run, batch = self.sealed_run()
        run(RecordBatchOutcomes(batch.batch_id, ("r1", "r2", "r3"), at=ms(10)))
        assert run(RecordBatchOutcomes(batch.batch_id, ("r1", "r2", "r3"), at=ms(11))) == []

    def test_conflicting_outcome_is_rejected(self) -> None:
        """A request that was created cannot later be recorded as failed."""
        run, batch = self.sealed_run()
        run(RecordBatchOutcomes(batch.batch_id, ("r1",), at=ms(10)))
        with pytest.raises(Rejected, match="exactly one outcome"):
            run(RecordBatchOutcomes(batch.batch_id, failed_request_ids=("r1",), at=ms(11)))

    def test_request_of_another_batch_is_invalid(self) -> None:
        """Outcomes must name requests of the batch they are reported for."""
        run, batch = self.sealed_run()
        with pytest.raises(InvalidCommand, match="not part of batch"):
            run(RecordBatchOutcomes(batch.batch_id, ("r9",), at=ms(10)))

    def test_both_outcomes_for_one_request_is_invalid(self) -> None:
        """A request cannot be listed as created and failed at once."""
        run, batch = self.sealed_run()
        with pytest.raises(InvalidCommand, match="both created and failed"):
            run(RecordBatchOutcomes(batch.batch_id, ("r1",), ("r1",), at=ms(10)))

    def test_outcomes_for_a_pending_batch_are_rejected(self) -> None:
        """A batch still pending cannot have outcomes."""
        run = Run()
        run(request(1, ms(0)))
        batch_id = pending_batches(run.state)[0].batch_id
        with pytest.raises(Rejected, match="still pending"):
            run(RecordBatchOutcomes(batch_id, ("r1",), at=ms(1)))


class TestBatchIds:
    def test_ids_are_deterministic(self) -> None:
        """The same commands always derive the same batch ids."""
        commands = [request(i, ms(i), (D4, D8)[i % 2]) for i in range(10)]
        first, second = Run(), Run()
        first(*commands, Shutdown(ms(20)))
        second(*commands, Shutdown(ms(20)))
        assert [b.batch_id for b in first.sealed] == [b.batch_id for b in second.sealed]

    def test_ids_name_the_template_and_are_unique(self) -> None:
        """A batch id starts with its template hash and is never reused."""
        run = Run()
        run(*(request(i, ms(i * 200), (D4, D8)[i % 2]) for i in range(8)), Shutdown(ms(2000)))
        ids = [b.batch_id for b in run.sealed]
        assert len(set(ids)) == len(ids) == 8
        assert all(b.batch_id.startswith(b.template_hash + "-") for b in run.sealed)


class TestTime:
    def test_naive_time_is_invalid(self) -> None:
        """Commands must carry timezone-aware times."""
        with pytest.raises(InvalidCommand, match="timezone-aware"):
            decide(initial_state(), Tick(datetime(2025, 1, 1)), CONFIG)

    def test_other_offsets_are_normalised_to_utc(self) -> None:
        """A time with a non-zero offset is recorded in UTC."""
        at = datetime(2025, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2)))
        (event,) = decide(initial_state(), request(1, at), CONFIG)
        assert event.at == T0 and event.at.utcoffset() == timedelta(0)

    def test_time_never_runs_backwards(self) -> None:
        """A command stamped before the latest event is treated as arriving at that event."""
        run = Run()
        run(request(1, ms(50)))
        (event,) = run(request(2, ms(10)))
        assert event.at == ms(50)


class TestValidation:
    @pytest.mark.parametrize(
        "command",
        [
            RequestMachine("", "m", D4, at=T0),
            RequestMachine("r", "", D4, at=T0),
            RequestMachine("r", "m", D4, zones=("1", "1"), at=T0),
            RequestMachine("r", "m", D4, zones=("",), at=T0),
            RequestMachine("r", "m", D4, tags=(("a", "1"), ("a", "2")), at=T0),
            RequestMachine("r", "m", D4, tags=(("", "1"),), at=T0),
            RequestMachine("r", "m", D4, zones=["1"], at=T0),  # type: ignore[arg-type]
        ],
    )
    def test_malformed_requests_are_invalid(self, command: RequestMachine) -> None:
        """Requests with empty ids, repeated zones or tag keys are refused."""
        with pytest.raises(InvalidCommand):
            decide(initial_state(), command, CONFIG)


class TestPoisonRequests:
    """Requests the log could not store, or Azure would refuse, are refused before any event."""

    @pytest.mark.parametrize(
        ("command", "field"),
        [
            (RequestMachine("r\x00", "m", D4, at=T0), "request_id"),
            (RequestMachine("r\ud800", "m", D4, at=T0), "request_id"),
            (RequestMachine("   ", "m", D4, at=T0), "request_id"),
            (RequestMachine("r" * 129, "m", D4, at=T0), "request_id"),
            (RequestMachine("r", "m\x00", D4, at=T0), "machine_name"),
            (RequestMachine("r", " ", D4, at=T0), "machine_name"),
            (RequestMachine("r", "a/b", D4, at=T0), "machine_name"),
            (RequestMachine("r", "M-1", D4, at=T0), "machine_name"),
            (RequestMachine("r", "m-", D4, at=T0), "machine_name"),
            (RequestMachine("r", "m" * 64, D4, at=T0), "machine_name"),
            (RequestMachine("r", "m", D4, zones=("1\n",), at=T0), "zones"),
            (RequestMachine("r", "m", D4, zones=("1", "2", "3", "4"), at=T0), "zones"),
            (RequestMachine("r", "m", D4, tags=(("team", "a\x00"),), at=T0), "tags"),
            (RequestMachine("r", "m", D4, tags=(("team", "\udfff"),), at=T0), "tags"),
            (RequestMachine("r", "m", D4, tags=(("a/b", "1"),), at=T0), "tags"),
            (RequestMachine("r", "m", D4, tags=(("k%", "1"),), at=T0), "tags"),
            (RequestMachine("r", "m", D4, tags=((" ", "1"),), at=T0), "tags"),
            (RequestMachine("r", "m", D4, tags=(("k" * 513, "1"),), at=T0), "tags"),
            (RequestMachine("r", "m", D4, tags=(("k", "v" * 257),), at=T0), "tags"),
            (
                RequestMachine("r", "m", D4, tags=tuple((f"k{i}", "v") for i in range(51)), at=T0),
                "tags",
            ),
            (
                RequestMachine("r", "m", MachineTemplate(vm_size="D4", max_pods=251), at=T0),
                "template",
            ),
            (
                RequestMachine("r", "m", MachineTemplate(vm_size="D4\x00"), at=T0),
                "template",
            ),
        ],
        ids=[
            "NUL in id",
            "surrogate in id",
            "blank id",
            "long id",
            "NUL in name",
            "blank name",
            "slash in name",
            "upper-case name",
            "name ending in a hyphen",
            "64-character name",
            "newline in zone",
            "four zones",
            "NUL in tag value",
            "surrogate in tag value",
            "slash in tag key",
            "percent in tag key",
            "blank tag key",
            "long tag key",
            "long tag value",
            "51 tags",
            "max_pods over 250",
            "NUL in the template",
        ],
    )
    def test_refused_naming_the_field(self, command: RequestMachine, field: str) -> None:
        """The refusal's message starts with the field at fault, so the edge can name it."""
        with pytest.raises(InvalidCommand) as refused:
            decide(initial_state(), command, CONFIG)

        assert refused.value.reason.split(" ", 1)[0] == field

    def test_requests_at_every_limit_are_accepted(self) -> None:
        """50 tags of the longest key and value, three zones and a 63-character name pass."""
        tags = tuple((f"{i:03d}" + "k" * 509, "v" * 256) for i in range(50))
        command = RequestMachine("r" * 128, "m" * 63, D4, zones=("1", "2", "3"), tags=tags, at=T0)

        (event,) = decide(initial_state(), command, CONFIG)

        assert isinstance(event, MachineRequested) and len(event.tags) == 50

    def test_stored_requests_fold_whatever_the_limits(self) -> None:
        """An event recorded before the limits existed still folds: limits are for new requests."""
        old = MachineRequested(
            "r\x00",
            "Upper/Case",
            MachineTemplate(vm_size="D4", max_pods=500),
            "h",
            (),
            (("a/b", "\x00"),),
            False,
            "h-00000001",
            T0,
        )

        state = evolve(initial_state(), old)

        assert request_status(state, "r\x00") == ("pending", "h-00000001")

    @settings(max_examples=200, deadline=None)
    @given(st.text(min_size=1, max_size=20))
    def test_any_text_is_refused_or_safe_to_store(self, value: str) -> None:
        """Whatever a tag value holds, it is refused or free of NUL, controls and surrogates."""
        command = RequestMachine("r", "m", D4, tags=(("k", value),), at=T0)
        try:
            decide(initial_state(), command, CONFIG)
        except InvalidCommand:
            return
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value)
        value.encode("utf-8")


class TestQueries:
    def test_next_deadline_is_none_when_idle(self) -> None:
        """Nothing pending, nothing to wake up for."""
        assert next_deadline(initial_state(), CONFIG) is None

    def test_next_deadline_is_the_earliest(self) -> None:
        """The earliest idle or max deadline across pending batches."""
        run = Run()
        run(request(1, ms(0), D4), request(2, ms(30), D8))
        assert next_deadline(run.state, CONFIG) == ms(100)

    def test_request_status_follows_the_request(self) -> None:
        """pending -> sealed -> created, and None for unknown ids."""
        run = Run()
        run(request(1, ms(0)))
        batch_id = pending_batches(run.state)[0].batch_id
        assert request_status(run.state, "r1") == ("pending", batch_id)
        run(Tick(ms(100)))
        assert request_status(run.state, "r1") == ("sealed", batch_id)
        run(RecordBatchOutcomes(batch_id, ("r1",), at=ms(200)))
        assert request_status(run.state, "r1") == ("created", batch_id)
        assert request_status(run.state, "nope") is None

    def test_pending_batches_oldest_first(self) -> None:
        """Pending batches are listed by their first request."""
        run = Run()
        run(request(1, ms(0), D8), request(2, ms(1), D4), request(3, ms(2), D8))
        assert [b.template for b in pending_batches(run.state)] == [D8, D4]
        assert [b.size for b in pending_batches(run.state)] == [2, 1]


class TestPersistentMap:
    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.booleans(),
                st.lists(st.tuples(st.integers(0, 300), st.integers()), min_size=1, max_size=40),
            ),
            max_size=120,
        )
    )
    def test_behaves_like_a_dict_and_keeps_old_versions(
        self, operations: list[tuple[bool, list[tuple[int, int]]]]
    ) -> None:
        """Bulk sets and removals match a plain dict, and every earlier version stays as it was."""
        model: dict[str, int] = {}
        pmap: _PersistentMap[int] = _PersistentMap()
        history: list[tuple[_PersistentMap[int], dict[str, int]]] = []
        for is_set, pairs in operations:
            if is_set:
                pmap = pmap.update((f"k{k}", v) for k, v in pairs)
                model.update((f"k{k}", v) for k, v in pairs)
            else:
                pmap = pmap.remove(f"k{k}" for k, _ in pairs)
                for k, _ in pairs:
                    model.pop(f"k{k}", None)
            history.append((pmap, dict(model)))
        for version, expected in history:
            assert dict(version.items()) == expected
            assert all(version.get(k) == v for k, v in expected.items())
            assert len(version) == len(expected)
        assert pmap.get("absent") is None

    def test_lookups_probe_logarithmically_many_runs(self) -> None:
        """After 10,000 single inserts the map holds at most log2(10,000) + 1 runs."""
        pmap = _PersistentMap[int]()
        for i in range(10_000):
            pmap = pmap.update([(f"key-{i}", i)])
        assert len(pmap._runs) <= 14
        assert len(pmap) == 10_000 and pmap.get("key-1234") == 1234

    def test_removed_keys_leave_no_tombstones_in_the_oldest_run(self) -> None:
        """Removals disappear for good once merged into the oldest run."""
        pmap = _PersistentMap[int]().update([("a", 1), ("b", 2)]).remove(["a"])
        pmap = pmap.update([("c", 3), ("d", 4), ("e", 5)])
        assert len(pmap._runs) == 1
        assert pmap._runs[0] == {"b": 2, "c": 3, "d": 4, "e": 5}


# -- invariants ----------------------------------------------------------------------------------

TEMPLATES = (D4, D8, E16)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[GrouperConfig, list[GrouperCommand]]:
    idle = draw(st.integers(1, 50))
    config = GrouperConfig(
        timedelta(milliseconds=idle),
        timedelta(milliseconds=draw(st.integers(idle, 120))),
        draw(st.integers(1, 6)),
    )
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(0, 40),  # ms since the previous command
                st.sampled_from(("request", "request", "request", "skip", "tick")),
                st.integers(0, len(TEMPLATES) - 1),
            ),
            max_size=60,
        )
    )
    commands: list[GrouperCommand] = []
    at = T0
    for n, (gap, kind, template) in enumerate(steps):
        at += timedelta(milliseconds=gap)
        if kind == "tick":
            commands.append(Tick(at))
        else:
            commands.append(request(n, at, TEMPLATES[template], skip=kind == "skip"))
    commands.append(Shutdown(at + timedelta(milliseconds=draw(st.integers(0, 200)))))
    return config, commands


def requests_of(commands: Sequence[GrouperCommand]) -> list[RequestMachine]:
    return [c for c in commands if isinstance(c, RequestMachine)]


class TestInvariants:
    @settings(max_examples=150, deadline=None)
    @given(scenarios())
    def test_no_batch_exceeds_max_size(
        self, scenario: tuple[GrouperConfig, list[GrouperCommand]]
    ) -> None:
        """Whatever the timing, no sealed batch holds more than max_batch_size requests."""
        config, commands = scenario
        run = Run(config)
        run(*commands)
        assert all(1 <= len(b.machines) <= config.max_batch_size for b in run.sealed)

    @settings(max_examples=100, deadline=None)
    @given(scenarios(), st.integers(1, 6), st.integers(0, 60))
    def test_a_lowered_limit_holds_for_every_batch_sealed_after_it(
        self, scenario: tuple[GrouperConfig, list[GrouperCommand]], limit: int, switch: int
    ) -> None:
        """Lowering max_batch_size mid-stream (a restart with a new config): every batch sealed
        from then on is within the new limit, and every request is still sealed exactly once."""
        config, commands = scenario
        run = Run(config)
        run(*commands[:switch])
        before = len(run.sealed)
        run.config = GrouperConfig(config.idle_timeout, config.max_timeout, limit)
        run(*commands[switch:])

        assert all(1 <= len(b.machines) <= limit for b in run.sealed[before:])
        sealed_ids = Counter(r for b in run.sealed for r in b.request_ids)
        assert set(sealed_ids.values()) <= {1}
        assert set(sealed_ids) == {c.request_id for c in requests_of(commands)}

    @settings(max_examples=150, deadline=None)
    @given(scenarios())
    def test_every_request_ends_in_exactly_one_batch(
        self, scenario: tuple[GrouperConfig, list[GrouperCommand]]
    ) -> None:
        """After Shutdown every accepted request is in exactly one sealed batch of its template."""
        config, commands = scenario
        run = Run(config)
        run(*commands)
        placed = Counter(r for b in run.sealed for r in b.request_ids)
        wanted = requests_of(commands)
        assert placed == Counter(c.request_id for c in wanted)
        by_id = {c.request_id: c for c in wanted}
        for batch in run.sealed:
            assert {template_hash(by_id[r].template) for r in batch.request_ids} == {
                batch.template_hash
            }
            assert batch.request_ids == tuple(m.request_id for m in batch.machines)
        assert pending_request_count(run.state) == 0

    @settings(max_examples=150, deadline=None)
    @given(scenarios())
    def test_batches_per_template_are_sealed_in_request_order(
        self, scenario: tuple[GrouperConfig, list[GrouperCommand]]
    ) -> None:
        """Concatenating a template's batches in seal order gives its requests in arrival order."""
        config, commands = scenario
        run = Run(config)
        run(*commands)
        for template in TEMPLATES:
            digest = template_hash(template)
            sealed_order = [
                r
                for b in run.sealed
                if b.template_hash == digest and b.reason != "skip"
                for r in b.request_ids
            ]
            arrival = [
                c.request_id
                for c in requests_of(commands)
                if c.template == template and not c.skip_batching
            ]
            assert sealed_order == arrival

    @settings(max_examples=150, deadline=None)
    @given(scenarios())
    def test_seals_do_not_depend_on_ticks(
        self, scenario: tuple[GrouperConfig, list[GrouperCommand]]
    ) -> None:
        """Dropping every Tick leaves the sealed batches, reasons and stamps unchanged."""
        config, commands = scenario
        ticked = Run(config)
        ticked(*commands)
        unticked = Run(config)
        unticked(*(c for c in commands if not isinstance(c, Tick)))
        assert ticked.sealed == unticked.sealed

    @settings(max_examples=100, deadline=None)
    @given(scenarios())
    def test_event_times_never_decrease(
        self, scenario: tuple[GrouperConfig, list[GrouperCommand]]
    ) -> None:
        """The grouper stream's event times are monotonic, seals stamped at deadlines included."""
        config, commands = scenario
        run = Run(config)
        run(*commands)
        times = [e.at for e in run.events]
        assert times == sorted(times)

    @settings(max_examples=100, deadline=None)
    @given(scenarios())
    def test_time_seals_happen_at_their_deadline(
        self, scenario: tuple[GrouperConfig, list[GrouperCommand]]
    ) -> None:
        """An idle or max seal is stamped exactly at that deadline of its batch."""
        config, commands = scenario
        run = Run(config)
        run(*commands)
        by_id = {c.request_id: c for c in requests_of(commands)}
        accepted_at = {e.request_id: e.at for e in run.events if isinstance(e, MachineRequested)}
        for batch in run.sealed:
            times = [accepted_at[r] for r in batch.request_ids]
            assert all(r in by_id for r in batch.request_ids)
            if batch.reason == "idle":
                assert batch.at == times[-1] + config.idle_timeout
            if batch.reason == "max":
                assert batch.at == times[0] + config.max_timeout
