"""The batch lifecycle: dispatch, per-machine outcomes, completion and crash recovery."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.machines import BatchMachine, BatchSealed
from fleetledger.domain.machines.batch import (
    REQUEST_TAG,
    BatchCommand,
    BatchCompleted,
    BatchDispatched,
    BatchEvent,
    BatchOpened,
    BatchState,
    MachineCreateAccepted,
    MachineCreated,
    MachineError,
    MachineFailed,
    MachineNotFound,
    OpenBatch,
    RecordCallFailure,
    RecordCreateAccepted,
    RecordDispatch,
    RecordMachineRead,
    RecordMachineResults,
    batch_put_machine_header,
    decide,
    encode_batch_put_machine_header,
    evolve,
    initial_state,
    is_complete,
    machines_to_dispatch,
    needs_dispatch,
    resume_token,
    status,
    unresolved_machines,
)
from fleetledger.domain.template import MachineTemplate, template_hash

T0 = datetime(2025, 1, 1, tzinfo=UTC)
TEMPLATE = MachineTemplate(vm_size="Standard_D4s_v5")
MACHINES = (
    BatchMachine("r1", "m1", ("1",), (("team", "a"),)),
    BatchMachine("r2", "m2"),
    BatchMachine("r3", "m3", ("2", "3")),
)
SEALED = BatchSealed(
    "b-1",
    template_hash(TEMPLATE),
    TEMPLATE,
    tuple(m.request_id for m in MACHINES),
    MACHINES,
    "full",
    T0,
)
CALL = ("PUT /agentPools/np1/machines (BatchPutMachine)",)
QUOTA = MachineError("quota_exceeded", "regional vCPU quota exceeded")
THROTTLED = MachineError("throttled", "too many requests", retryable=True, retry_after_seconds=7.0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class _Variation:
    machine_name: str
    zones: tuple[str, ...]
    tags: tuple[tuple[str, str], ...]
    request_id: str | None


class Batch:
    """One batch stream driven through commands, keeping every event."""

    def __init__(self) -> None:
        self.state: BatchState = initial_state()
        self.events: list[BatchEvent] = []

    def __call__(self, *commands: BatchCommand) -> list[BatchEvent]:
        produced: list[BatchEvent] = []
        for command in commands:
            new = decide(self.state, command)
            for event in new:
                self.state = evolve(self.state, event)
            produced.extend(new)
        self.events.extend(produced)
        return produced

    def dispatch(self, attempt: int = 1, seconds: float = 1) -> list[BatchEvent]:
        header = encode_batch_put_machine_header(machines_to_dispatch(self.state))
        return self(RecordDispatch("b-1", attempt, CALL, header, at=at(seconds)))

    def terminal(self) -> Counter[str]:
        return Counter(
            e.request_id for e in self.events if isinstance(e, MachineCreated | MachineFailed)
        )


def opened() -> Batch:
    batch = Batch()
    batch(OpenBatch(SEALED, at=at(0)))
    return batch


def dispatched() -> Batch:
    batch = opened()
    batch.dispatch()
    return batch


class TestBatchPutMachineHeader:
    def test_lists_every_machine_in_order_tagged_with_its_request(self) -> None:
        """Every machine appears in order with its zones, its tags and its request id as the
        ``fleetledger-request`` tag."""
        assert batch_put_machine_header(MACHINES) == {
            "vmSkus": {"value": []},
            "batchMachines": [
                {
                    "machineName": "m1",
                    "zones": ["1"],
                    "tags": {"team": "a", "fleetledger-request": "r1"},
                },
                {"machineName": "m2", "zones": [], "tags": {"fleetledger-request": "r2"}},
                {"machineName": "m3", "zones": ["2", "3"], "tags": {"fleetledger-request": "r3"}},
            ],
        }

    def test_a_machine_without_a_request_has_empty_defaults(self) -> None:
        """A machine that does not know its request carries no request tag; absent zones are []
        and absent tags {}, never omitted."""
        anonymous = _Variation("m9", (), (), None)

        assert batch_put_machine_header([anonymous])["batchMachines"] == [
            {"machineName": "m9", "zones": [], "tags": {}}
        ]

    def test_the_request_tag_overrides_a_caller_tag_of_that_name(self) -> None:
        """Ownership is stated by the controller: a caller's tag cannot disguise the request."""
        machine = BatchMachine("r1", "m1", (), ((REQUEST_TAG, "someone-else"),))

        assert batch_put_machine_header([machine])["batchMachines"] == [
            {"machineName": "m1", "zones": [], "tags": {REQUEST_TAG: "r1"}}
        ]

    @settings(max_examples=100, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.text(min_size=1, max_size=8),
                st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
            ),
            min_size=1,
            max_size=5,
        )
    )
    def test_each_machine_carries_its_own_request_and_its_own_tags(
        self, specs: list[tuple[str, dict[str, str]]]
    ) -> None:
        """Whatever the tags, each entry holds its machine's tags plus its own request id."""
        machines = [
            BatchMachine(request_id, f"m{i}", (), tuple(tags.items()))
            for i, (request_id, tags) in enumerate(specs)
        ]

        entries = json.loads(encode_batch_put_machine_header(machines))["batchMachines"]

        assert [e["tags"] for e in entries] == [
            {**tags, REQUEST_TAG: request_id} for request_id, tags in specs
        ]

    def test_the_request_tag_key_is_one_azure_accepts(self) -> None:
        """Azure refuses tag names containing / < > % & \\ ?."""
        assert not set(REQUEST_TAG) & set("/<>%&\\?")

    def test_encoding_is_compact_json_of_the_header(self) -> None:
        """The encoded header is the compact JSON of the same structure."""
        text = encode_batch_put_machine_header(MACHINES)
        assert json.loads(text) == batch_put_machine_header(MACHINES)
        assert " " not in text


class TestOpen:
    def test_open_copies_the_seal(self) -> None:
        """The stream starts with a self-contained copy of the sealed batch."""
        batch = Batch()
        (event,) = batch(OpenBatch(SEALED, at=at(0)))
        assert event == BatchOpened(
            "b-1", SEALED.template_hash, TEMPLATE, MACHINES, "full", T0, 3, T0
        )
        assert status(batch.state) == "sealed"
        assert needs_dispatch(batch.state)
        assert machines_to_dispatch(batch.state) == MACHINES

    def test_reopening_the_same_seal_is_a_no_op(self) -> None:
        """Opening again from the same seal (a retried reactor) changes nothing."""
        batch = opened()
        assert batch(OpenBatch(SEALED, at=at(5))) == []

    def test_opening_with_other_content_is_rejected(self) -> None:
        """A batch id names exactly one sealed batch."""
        batch = opened()
        other = BatchSealed(
            "b-1", SEALED.template_hash, TEMPLATE, ("r1",), MACHINES[:1], "idle", T0
        )
        with pytest.raises(Rejected, match="different content"):
            batch(OpenBatch(other, at=at(1)))

    def test_commands_before_opening_are_rejected(self) -> None:
        """Nothing can be recorded for a batch that is not open."""
        with pytest.raises(Rejected, match="not open"):
            Batch()(RecordDispatch("b-1", 1, CALL, at=at(0)))

    def test_command_for_another_batch_is_invalid(self) -> None:
        """A command carrying another batch id is refused."""
        with pytest.raises(InvalidCommand, match="sent to the stream of batch b-1"):
            opened()(RecordDispatch("b-2", 1, CALL, at=at(0)))

    def test_duplicate_machine_names_cannot_be_opened(self) -> None:
        """A seal listing one machine name twice is refused."""
        bad = BatchSealed(
            "b-9", "h", TEMPLATE, ("r1", "r2"), (BatchMachine("r1", "x"), BatchMachine("r2", "x")),
            "full", T0,
        )  # fmt: skip
        with pytest.raises(InvalidCommand, match="machine name twice"):
            Batch()(OpenBatch(bad, at=at(0)))


class TestDispatch:
    def test_first_dispatch_covers_every_machine(self) -> None:
        """Attempt 1 sends every machine; afterwards all are in doubt and none to dispatch."""
        batch = opened()
        (event,) = batch.dispatch()
        assert isinstance(event, BatchDispatched)
        assert (event.attempt, event.request_ids, event.calls) == (1, ("r1", "r2", "r3"), CALL)
        assert status(batch.state) == "dispatched"
        assert not needs_dispatch(batch.state)
        assert unresolved_machines(batch.state) == MACHINES

    def test_header_must_match_the_batch(self) -> None:
        """A header that drops or reorders machines is refused."""
        reordered = encode_batch_put_machine_header((MACHINES[1], MACHINES[0], MACHINES[2]))
        with pytest.raises(InvalidCommand, match="in batch order"):
            opened()(RecordDispatch("b-1", 1, CALL, reordered, at=at(1)))
        with pytest.raises(InvalidCommand, match="not valid JSON"):
            opened()(RecordDispatch("b-1", 1, CALL, "{", at=at(1)))

    def test_per_machine_calls_need_no_header(self) -> None:
        """Creating by per-machine PUTs records the calls without a header."""
        calls = tuple(f"PUT /virtualMachines/{m.machine_name}" for m in MACHINES)
        (event,) = opened()(RecordDispatch("b-1", 1, calls, None, at=at(1)))
        assert isinstance(event, BatchDispatched) and event.header is None

    def test_repeated_dispatch_is_a_no_op(self) -> None:
        """Recording the same attempt again (a retried append) changes nothing."""
        batch = opened()
        header = encode_batch_put_machine_header(MACHINES)
        command = RecordDispatch("b-1", 1, CALL, header, at=at(1))
        batch(command)
        assert batch(command) == []
        with pytest.raises(Rejected, match="different calls"):
            batch(RecordDispatch("b-1", 1, ("PUT elsewhere",), header, at=at(1)))

    def test_a_header_without_request_tags_is_refused(self) -> None:
        """A new dispatch must tag each machine with its request, as the header function does."""
        untagged = json.dumps(
            {
                "vmSkus": {"value": []},
                "batchMachines": [
                    {"machineName": m.machine_name, "zones": list(m.zones), "tags": dict(m.tags)}
                    for m in MACHINES
                ],
            }
        )
        with pytest.raises(InvalidCommand, match="does not match"):
            opened()(RecordDispatch("b-1", 1, CALL, untagged, at=at(1)))

    def test_a_recorded_header_without_request_tags_still_folds(self) -> None:
        """A dispatch recorded before machines carried request tags replays as it was; only the
        next dispatch is checked against today's header."""
        untagged = json.dumps(
            {
                "vmSkus": {"value": []},
                "batchMachines": [
                    {"machineName": m.machine_name, "zones": list(m.zones), "tags": dict(m.tags)}
                    for m in MACHINES
                ],
            },
            separators=(",", ":"),
        )
        old = BatchDispatched("b-1", 1, ("r1", "r2", "r3"), CALL, untagged, at(1))
        batch = opened()
        batch.state = evolve(batch.state, old)
        batch(RecordMachineRead("b-1", "m2", "not_found", at=at(2)))

        (second,) = batch.dispatch(attempt=2, seconds=3)

        assert batch.state.dispatches[0].header == untagged
        assert unresolved_machines(batch.state) == MACHINES
        assert isinstance(second, BatchDispatched) and second.header is not None
        assert json.loads(second.header)["batchMachines"][0]["tags"] == {REQUEST_TAG: "r2"}

    def test_dispatch_after_dispatch_requires_a_read(self) -> None:
        """With every machine in doubt, a new attempt is refused: read them first."""
        batch = dispatched()
        with pytest.raises(Rejected, match=r"read the unresolved machines \(m1, m2, m3\)"):
            batch(RecordDispatch("b-1", 2, CALL, at=at(2)))

    def test_attempts_are_numbered_in_order(self) -> None:
        """Skipping an attempt number is invalid."""
        with pytest.raises(InvalidCommand, match="next attempt is 1"):
            opened()(RecordDispatch("b-1", 2, CALL, at=at(1)))

    def test_calls_must_be_described(self) -> None:
        """A dispatch without call descriptions is invalid."""
        with pytest.raises(InvalidCommand, match="calls"):
            opened()(RecordDispatch("b-1", 1, (), at=at(1)))


class TestCallFailure:
    def test_whole_call_failure_fails_each_request_with_that_error(self) -> None:
        """Each unresolved request gets its own MachineFailed carrying the call's error."""
        batch = dispatched()
        events = batch(RecordCallFailure("b-1", 1, THROTTLED, at=at(2)))
        failures = [e for e in events if isinstance(e, MachineFailed)]
        assert [(f.request_id, f.machine_name) for f in failures] == [
            ("r1", "m1"),
            ("r2", "m2"),
            ("r3", "m3"),
        ]
        assert {(f.code, f.message, f.retryable, f.retry_after_seconds) for f in failures} == {
            ("throttled", "too many requests", True, 7.0)
        }
        assert events[-1] == BatchCompleted("b-1", (), ("r1", "r2", "r3"), at(2))

    def test_call_failure_spares_machines_already_resolved(self) -> None:
        """A machine already known created keeps that outcome."""
        batch = dispatched()
        batch(RecordMachineResults("b-1", created={"m2": "/vm/m2"}, at=at(2)))
        events = batch(RecordCallFailure("b-1", 1, QUOTA, at=at(3)))
        assert [e.request_id for e in events if isinstance(e, MachineFailed)] == ["r1", "r3"]
        assert events[-1] == BatchCompleted("b-1", ("r2",), ("r1", "r3"), at(3))

    def test_call_failure_without_dispatch_is_rejected(self) -> None:
        """A call that was never recorded cannot have failed."""
        with pytest.raises(Rejected, match="no dispatch"):
            opened()(RecordCallFailure("b-1", 1, QUOTA, at=at(1)))

    def test_stale_attempt_is_rejected(self) -> None:
        """A failure for an older attempt cannot fail machines dispatched again since."""
        batch = dispatched()
        batch(RecordMachineRead("b-1", "m1", "not_found", at=at(2)))
        batch.dispatch(attempt=2, seconds=3)
        with pytest.raises(Rejected, match="not the latest dispatch"):
            batch(RecordCallFailure("b-1", 1, QUOTA, at=at(4)))

    def test_repeated_call_failure_is_a_no_op(self) -> None:
        """Recording the failure twice changes nothing."""
        batch = dispatched()
        batch(RecordCallFailure("b-1", 1, QUOTA, at=at(2)))
        assert batch(RecordCallFailure("b-1", 1, QUOTA, at=at(3))) == []


class TestResults:
    def test_partial_results_leave_missing_machines_unresolved(self) -> None:
        """Machines absent from the result map are not assumed created."""
        batch = dispatched()
        events = batch(
            RecordMachineResults("b-1", created={"m1": "/vm/m1"}, failed={"m3": QUOTA}, at=at(2))
        )
        assert [type(e) for e in events] == [MachineCreated, MachineFailed]
        assert unresolved_machines(batch.state) == (MACHINES[1],)
        assert not is_complete(batch.state)

    def test_missing_machine_is_resolved_by_reading_it(self) -> None:
        """The runtime reads the missing machine; what it finds completes the batch."""
        batch = dispatched()
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1", "m3": "/vm/m3"}, at=at(2)))
        events = batch(RecordMachineRead("b-1", "m2", "created", "/vm/m2", at=at(3)))
        assert events == [
            MachineCreated("b-1", "r2", "m2", "/vm/m2", at(3)),
            BatchCompleted("b-1", ("r1", "r2", "r3"), (), at(3)),
        ]
        assert status(batch.state) == "completed"

    def test_every_request_gets_exactly_one_terminal_outcome(self) -> None:
        """Across results, reads and repeats, each request ends exactly once."""
        batch = dispatched()
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, at=at(2)))
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, failed={"m2": QUOTA}, at=at(3)))
        batch(RecordMachineRead("b-1", "m2", "failed", error=QUOTA, at=at(4)))
        batch(RecordMachineRead("b-1", "m3", "created", "/vm/m3", at=at(5)))
        assert batch.terminal() == Counter({"r1": 1, "r2": 1, "r3": 1})
        assert [type(e) for e in batch.events].count(BatchCompleted) == 1

    def test_second_different_outcome_is_rejected(self) -> None:
        """A created machine cannot later be reported failed."""
        batch = dispatched()
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, at=at(2)))
        with pytest.raises(Rejected, match="exactly one outcome"):
            batch(RecordMachineResults("b-1", failed={"m1": QUOTA}, at=at(3)))
        with pytest.raises(Rejected, match="exactly one outcome"):
            batch(RecordMachineResults("b-1", created={"m1": "/vm/other"}, at=at(3)))

    def test_unknown_machine_is_invalid(self) -> None:
        """Results must name machines of the batch."""
        with pytest.raises(InvalidCommand, match="m9"):
            dispatched()(RecordMachineResults("b-1", created={"m9": "/vm/m9"}, at=at(2)))

    def test_machine_in_both_maps_is_invalid(self) -> None:
        """A machine cannot be reported created and failed in one result."""
        with pytest.raises(InvalidCommand, match="both created and failed"):
            dispatched()(
                RecordMachineResults("b-1", created={"m1": "/vm"}, failed={"m1": QUOTA}, at=at(2))
            )

    def test_results_before_dispatch_are_rejected(self) -> None:
        """Results need a recorded dispatch."""
        with pytest.raises(Rejected, match="record the dispatch"):
            opened()(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, at=at(1)))


class TestRead:
    def test_not_found_sends_the_machine_back_to_dispatch(self) -> None:
        """A dispatched machine read as absent is dispatched again, and only it."""
        batch = dispatched()
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1", "m3": "/vm/m3"}, at=at(2)))
        (event,) = batch(RecordMachineRead("b-1", "m2", "not_found", at=at(3)))
        assert event == MachineNotFound("b-1", "r2", "m2", at(3))
        assert needs_dispatch(batch.state)
        assert machines_to_dispatch(batch.state) == (MACHINES[1],)
        (second,) = batch.dispatch(attempt=2, seconds=4)
        assert isinstance(second, BatchDispatched) and second.request_ids == ("r2",)
        assert second.header is not None
        assert json.loads(second.header)["batchMachines"] == [
            {"machineName": "m2", "zones": [], "tags": {REQUEST_TAG: "r2"}}
        ]

    def test_not_found_after_the_last_attempt_fails_not_created(self) -> None:
        """After max_attempts a machine still absent fails with code not_created."""
        batch = dispatched()
        for attempt in (2, 3):
            batch(RecordMachineRead("b-1", "m1", "not_found", at=at(attempt)))
            batch.dispatch(attempt=attempt, seconds=attempt)
        events = batch(RecordMachineRead("b-1", "m1", "not_found", at=at(9)))
        (failed,) = events
        assert isinstance(failed, MachineFailed)
        assert (failed.code, failed.retryable) == ("not_created", True)
        assert "3 create attempt" in failed.message

    def test_a_deleted_leftover_is_recorded_on_its_failure(self) -> None:
        """A failed machine the adapter deleted ends failed with ``deleted`` set; others not."""
        batch = dispatched()
        capacity = MachineError("capacity_unavailable", "no D4s_v5 in zone 2")

        events = batch(
            RecordMachineResults(
                "b-1", failed={"m1": capacity, "m2": capacity}, at=at(2), deleted=("m1",)
            )
        )

        failures = {e.machine_name: e.deleted for e in events if isinstance(e, MachineFailed)}
        assert failures == {"m1": True, "m2": False}

    def test_a_failed_read_records_the_deletion_of_its_leftover(self) -> None:
        """A machine found failed by a read and deleted by the adapter ends failed with
        ``deleted`` set, as in batch results."""
        batch = dispatched()
        capacity = MachineError("capacity_unavailable", "no D4s_v5 in zone 2")

        (event,) = batch(
            RecordMachineRead("b-1", "m1", "failed", error=capacity, at=at(2), deleted=True)
        )

        assert isinstance(event, MachineFailed)
        assert (event.code, event.deleted) == ("capacity_unavailable", True)

    def test_a_failed_read_without_deletion_leaves_deleted_unset(self) -> None:
        """A failed read that deleted nothing says so: ``deleted`` defaults to false."""
        batch = dispatched()

        (event,) = batch(RecordMachineRead("b-1", "m1", "failed", error=QUOTA, at=at(2)))

        assert isinstance(event, MachineFailed) and event.deleted is False

    @pytest.mark.parametrize(
        "read",
        [
            RecordMachineRead("b-1", "m1", "created", "/vm/m1", at=T0, deleted=True),
            RecordMachineRead("b-1", "m1", "not_found", at=T0, deleted=True),
        ],
    )
    def test_only_a_failed_read_can_record_a_deletion(self, read: RecordMachineRead) -> None:
        """A machine that exists, or was not found, left no failed leftover to delete."""
        with pytest.raises(InvalidCommand, match="deleted must be"):
            dispatched()(read)

    def test_deleting_a_machine_not_reported_failed_is_refused(self) -> None:
        """Only a failed machine leaves something to delete."""
        batch = dispatched()

        with pytest.raises(InvalidCommand, match="deleted must be"):
            batch(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, at=at(2), deleted=("m1",)))

    def test_giving_up_names_the_first_call_error(self) -> None:
        """When create calls ended without a classified answer, the not_created failure keeps the
        first one's class and message rather than only counting attempts."""
        batch = dispatched()
        first = "ValueError: unexpected payload from the cloud"
        batch(RecordMachineRead("b-1", "m1", "not_found", at=at(2), call_error=first))
        batch.dispatch(attempt=2, seconds=2)
        batch(RecordMachineRead("b-1", "m1", "not_found", at=at(3), call_error="OSError: reset"))
        batch.dispatch(attempt=3, seconds=3)

        (failed,) = batch(RecordMachineRead("b-1", "m1", "not_found", at=at(9)))

        assert isinstance(failed, MachineFailed)
        assert failed.code == "not_created"
        assert failed.message.endswith(f"the first create call ended with {first}")

    def test_a_not_found_read_records_its_call_error(self) -> None:
        """The call error travels in MachineNotFound, so replaying the log keeps it."""
        batch = dispatched()

        (event,) = batch(
            RecordMachineRead("b-1", "m1", "not_found", at=at(2), call_error="KeyError: 'id'")
        )

        assert event == MachineNotFound("b-1", "r1", "m1", at(2), "KeyError: 'id'")
        assert batch.state.first_call_error == "KeyError: 'id'"

    def test_an_empty_call_error_is_refused(self) -> None:
        """call_error is a description or None, never an empty string."""
        batch = dispatched()

        with pytest.raises(InvalidCommand, match="call_error"):
            batch(RecordMachineRead("b-1", "m1", "not_found", at=at(2), call_error=""))

    def test_not_found_before_dispatch_is_a_no_op(self) -> None:
        """Reading a machine never sent finds nothing new."""
        assert opened()(RecordMachineRead("b-1", "m1", "not_found", at=at(1))) == []

    def test_read_matching_the_outcome_is_a_no_op(self) -> None:
        """Reading a created machine again changes nothing."""
        batch = dispatched()
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, at=at(2)))
        assert batch(RecordMachineRead("b-1", "m1", "created", "/vm/m1", at=at(3))) == []

    def test_read_contradicting_the_outcome_is_rejected(self) -> None:
        """A created machine read as failed or absent is refused, not silently changed."""
        batch = dispatched()
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, at=at(2)))
        with pytest.raises(Rejected, match="exactly one outcome"):
            batch(RecordMachineRead("b-1", "m1", "failed", error=QUOTA, at=at(3)))
        with pytest.raises(Rejected, match="already ended created"):
            batch(RecordMachineRead("b-1", "m1", "not_found", at=at(3)))

    @pytest.mark.parametrize(
        "read",
        [
            RecordMachineRead("b-1", "m1", "created", at=T0),
            RecordMachineRead("b-1", "m1", "failed", "/vm/m1", at=T0),
            RecordMachineRead("b-1", "m1", "not_found", "/vm/m1", at=T0),
            RecordMachineRead("b-1", "m9", "not_found", at=T0),
            RecordMachineRead("b-1", "m1", "gone", at=T0),  # type: ignore[arg-type]
        ],
    )
    def test_malformed_reads_are_invalid(self, read: RecordMachineRead) -> None:
        """A read's result and its provider id / error must agree, for a machine of the batch."""
        with pytest.raises(InvalidCommand):
            dispatched()(read)


class TestCompletion:
    def test_completion_lists_outcomes_in_batch_order(self) -> None:
        """BatchCompleted names created and failed requests in batch order."""
        batch = dispatched()
        events = batch(
            RecordMachineResults(
                "b-1", created={"m3": "/vm/m3", "m1": "/vm/m1"}, failed={"m2": QUOTA}, at=at(2)
            )
        )
        assert events[-1] == BatchCompleted("b-1", ("r1", "r3"), ("r2",), at(2))
        assert is_complete(batch.state) and not needs_dispatch(batch.state)

    def test_nothing_can_be_dispatched_after_completion(self) -> None:
        """A completed batch refuses a new attempt."""
        batch = dispatched()
        batch(RecordCallFailure("b-1", 1, QUOTA, at=at(2)))
        with pytest.raises(Rejected, match="complete"):
            batch(RecordDispatch("b-1", 2, CALL, at=at(3)))


class TestCrashRecovery:
    def replay(self, events: Sequence[BatchEvent]) -> BatchState:
        state = initial_state()
        for event in events:
            state = evolve(state, event)
        return state

    def test_sealed_but_not_dispatched_resumes_with_a_dispatch(self) -> None:
        """Restarted after opening: nothing reached the cloud, so dispatch everything."""
        state = self.replay(opened().events)
        assert needs_dispatch(state) and unresolved_machines(state) == ()

    def test_dispatched_without_results_resumes_with_reads(self) -> None:
        """Restarted after a dispatch: every machine is in doubt; read them, do not re-create."""
        state = self.replay(dispatched().events)
        assert not needs_dispatch(state)
        assert unresolved_machines(state) == MACHINES
        with pytest.raises(Rejected, match="before creating anything again"):
            decide(state, RecordDispatch("b-1", 2, CALL, at=at(9)))

    def test_replayed_state_equals_the_live_one(self) -> None:
        """Folding the recorded events rebuilds exactly the state the live stream had."""
        batch = dispatched()
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, at=at(2)))
        batch(RecordMachineRead("b-1", "m2", "not_found", at=at(3)))
        assert self.replay(batch.events) == batch.state


class TestCreateAccepted:
    def test_token_is_recorded_for_a_dispatched_machine(self) -> None:
        """An accepted create's resume token is kept until the machine has an outcome."""
        batch = dispatched()
        [event] = batch(RecordCreateAccepted("b-1", "m2", "token-2", at=at(2)))
        assert isinstance(event, MachineCreateAccepted) and event.request_id == "r2"
        assert resume_token(batch.state, "m2") == "token-2"

    def test_repeated_token_is_idempotent(self) -> None:
        """The same note twice records one event."""
        batch = dispatched()
        batch(RecordCreateAccepted("b-1", "m2", "token-2", at=at(2)))
        assert batch(RecordCreateAccepted("b-1", "m2", "token-2", at=at(3))) == []

    def test_token_is_dropped_with_the_outcome(self) -> None:
        """Once the machine is created (or missing) its token is no longer resumable."""
        batch = dispatched()
        batch(RecordCreateAccepted("b-1", "m1", "t1", at=at(2)))
        batch(RecordCreateAccepted("b-1", "m2", "t2", at=at(2)))
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, at=at(3)))
        batch(RecordMachineRead("b-1", "m2", "not_found", at=at(4)))
        assert (resume_token(batch.state, "m1"), resume_token(batch.state, "m2")) == (None, None)

    def test_late_note_after_the_outcome_changes_nothing(self) -> None:
        """A token reported after the machine's outcome is ignored."""
        batch = dispatched()
        batch(RecordMachineResults("b-1", created={"m1": "/vm/m1"}, at=at(2)))
        assert batch(RecordCreateAccepted("b-1", "m1", "t1", at=at(3))) == []

    def test_note_before_the_dispatch_is_rejected(self) -> None:
        """A token for a machine not yet dispatched means the dispatch was not recorded first."""
        with pytest.raises(Rejected, match="record the dispatch"):
            opened()(RecordCreateAccepted("b-1", "m1", "t1", at=at(1)))

    def test_token_survives_a_replay(self) -> None:
        """A restarted controller folds the token back, so it can resume polling."""
        batch = dispatched()
        batch(RecordCreateAccepted("b-1", "m3", "t3", at=at(2)))
        state = TestCrashRecovery().replay(batch.events)
        assert resume_token(state, "m3") == "t3"


class TestMachineError:
    def test_unknown_code_is_invalid(self) -> None:
        """Only the classified codes are accepted, with advice for the rest."""
        with pytest.raises(InvalidCommand, match="classify unrecognised cloud errors"):
            MachineError("oops", "x")  # type: ignore[arg-type]

    def test_negative_retry_after_is_invalid(self) -> None:
        """retry_after_seconds cannot be negative."""
        with pytest.raises(InvalidCommand):
            MachineError("throttled", "x", True, -1.0)


# -- invariants ----------------------------------------------------------------------------------

_NAMES = tuple(m.machine_name for m in MACHINES)
_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("dispatch")),
        st.tuples(st.just("call_failure"), st.sampled_from((QUOTA, THROTTLED))),
        st.tuples(
            st.just("results"),
            st.dictionaries(st.sampled_from(_NAMES), st.sampled_from(("created", "failed"))),
        ),
        st.tuples(
            st.just("read"),
            st.sampled_from(_NAMES),
            st.sampled_from(("created", "failed", "not_found")),
        ),
    ),
    max_size=25,
)


def _command(state: BatchState, action: tuple[object, ...], seconds: int) -> BatchCommand:
    when = at(seconds)
    kind = action[0]
    if kind == "dispatch":
        header = encode_batch_put_machine_header(machines_to_dispatch(state))
        return RecordDispatch("b-1", len(state.dispatches) + 1, CALL, header, at=when)
    if kind == "call_failure":
        error = action[1]
        assert isinstance(error, MachineError)
        return RecordCallFailure("b-1", len(state.dispatches), error, at=when)
    if kind == "results":
        results = action[1]
        assert isinstance(results, dict)
        return RecordMachineResults(
            "b-1",
            created={n: f"/vm/{n}" for n, r in results.items() if r == "created"},
            failed={n: QUOTA for n, r in results.items() if r == "failed"},
            at=when,
        )
    name, result = action[1], action[2]
    assert isinstance(name, str)
    if result == "created":
        return RecordMachineRead("b-1", name, "created", f"/vm/{name}", at=when)
    if result == "failed":
        return RecordMachineRead("b-1", name, "failed", error=QUOTA, at=when)
    return RecordMachineRead("b-1", name, "not_found", at=when)


class TestInvariants:
    @settings(max_examples=300, deadline=None)
    @given(_ACTIONS)
    def test_at_most_one_outcome_and_completion_exactly_when_all_resolved(
        self, actions: list[tuple[object, ...]]
    ) -> None:
        """Whatever arrives, no request ends twice and BatchCompleted appears once, at the end."""
        batch = opened()
        for seconds, action in enumerate(actions, start=1):
            try:
                batch(_command(batch.state, action, seconds))
            except Rejected:
                continue  # refusals are fine; they must not change anything
        terminal = batch.terminal()
        assert all(count == 1 for count in terminal.values())
        completions = [e for e in batch.events if isinstance(e, BatchCompleted)]
        assert len(completions) == (1 if len(terminal) == len(MACHINES) else 0)
        if completions:
            assert batch.events[-1] == completions[0] or is_complete(batch.state)
            done = completions[0]
            assert sorted(done.created_request_ids + done.failed_request_ids) == ["r1", "r2", "r3"]
        # Every machine is in exactly one place: resolved, in doubt, or waiting for dispatch.
        resolved = set(terminal)
        in_doubt = {m.request_id for m in unresolved_machines(batch.state)}
        waiting = {m.request_id for m in machines_to_dispatch(batch.state)}
        assert resolved | in_doubt | waiting == {"r1", "r2", "r3"}
        assert not (resolved & in_doubt or resolved & waiting or in_doubt & waiting)
