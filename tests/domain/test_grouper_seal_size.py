"""Seals within a size: the grouper splits a batch too large for one seal, and refuses a request
too large to be sealed at all; ``seal_size`` bounds what the batch's events carry."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.codec import to_data
from fleetledger.domain.errors import InvalidCommand
from fleetledger.domain.machines import (
    BatchDispatched,
    BatchOpened,
    encode_batch_put_machine_header,
)
from fleetledger.domain.machines.grouper import (
    BatchMachine,
    BatchSealed,
    GrouperConfig,
    GrouperEvent,
    GrouperState,
    MachineRequested,
    RecordBatchOutcomes,
    RequestMachine,
    Shutdown,
    Tick,
    decide,
    evolve,
    initial_state,
    pending_batches,
    request_status,
    seal_size,
)
from fleetledger.domain.template import MachineTemplate, template_hash

T0 = datetime(2025, 1, 1, tzinfo=UTC)
D4 = MachineTemplate(vm_size="Standard_D4s_v5", orchestrator_version="1.31.2", max_pods=110)
IDLE = timedelta(seconds=1)


def config(*, max_seal_bytes: int | None, max_batch_size: int = 50) -> GrouperConfig:
    return GrouperConfig(IDLE, timedelta(seconds=5), max_batch_size, max_seal_bytes=max_seal_bytes)


def big_tags(n: int, *, count: int = 10, width: int = 200) -> tuple[tuple[str, str], ...]:
    """``count`` tags of ``width`` characters each, distinct per request ``n``."""
    return tuple((f"k{i:02d}-{n}", f"{n}-{i}-".ljust(width, "v")) for i in range(count))


def request(
    n: int,
    *,
    at: datetime = T0,
    tags: tuple[tuple[str, str], ...] = (),
    template: MachineTemplate = D4,
    skip: bool = False,
) -> RequestMachine:
    return RequestMachine(f"r{n}", f"m{n}", template, tags=tags, skip_batching=skip, at=at)


def machine_of(command: RequestMachine) -> BatchMachine:
    return BatchMachine(
        command.request_id, command.machine_name, command.zones, tuple(sorted(command.tags))
    )


class Run:
    """A grouper driven through commands, keeping every event."""

    def __init__(self, config: GrouperConfig) -> None:
        self.config = config
        self.state: GrouperState = initial_state()
        self.events: list[GrouperEvent] = []

    def __call__(self, *commands: RequestMachine | Tick | Shutdown) -> list[GrouperEvent]:
        produced: list[GrouperEvent] = []
        for command in commands:
            new = decide(self.state, command, self.config)
            for event in new:
                self.state = evolve(self.state, event)
            produced.extend(new)
        self.events.extend(produced)
        return produced


def seals(events: Sequence[GrouperEvent]) -> list[BatchSealed]:
    return [e for e in events if isinstance(e, BatchSealed)]


def size_of(seal: BatchSealed) -> int:
    return seal_size(seal.template, seal.machines)


# A bound that holds about four of the big-tagged requests (each a little over 4 kB) per seal.
BOUND = seal_size(D4, [machine_of(request(n, tags=big_tags(n))) for n in range(4)]) + 100


class TestSplitBySize:
    def test_a_batch_too_large_for_one_seal_is_sealed_in_parts_that_fit(self) -> None:
        """Ten large requests idle out as parts under the bound, in request order."""
        run = Run(config(max_seal_bytes=BOUND))
        run(*(request(n, tags=big_tags(n)) for n in range(10)))

        parts = seals(run(Tick(T0 + IDLE)))

        assert len(parts) == 3
        assert all(size_of(p) <= BOUND for p in parts)
        assert [r for p in parts for r in p.request_ids] == [f"r{n}" for n in range(10)]
        assert {p.reason for p in parts} == {"idle"}
        assert pending_batches(run.state) == ()

    def test_without_a_size_bound_the_same_batch_is_sealed_whole(self) -> None:
        """The bound is what splits: with none the ten go in one seal."""
        run = Run(config(max_seal_bytes=None))
        run(*(request(n, tags=big_tags(n)) for n in range(10)))

        parts = seals(run(Tick(T0 + IDLE)))

        assert [len(p.request_ids) for p in parts] == [10]

    def test_parts_take_numbered_ids_and_requests_report_their_part(self) -> None:
        """The first part keeps the batch id, the next are ``<id>.2``, ``<id>.3``."""
        run = Run(config(max_seal_bytes=BOUND))
        run(*(request(n, tags=big_tags(n)) for n in range(10)))
        batch_id = pending_batches(run.state)[0].batch_id

        parts = seals(run(Tick(T0 + IDLE)))

        assert [p.batch_id for p in parts] == [batch_id, f"{batch_id}.2", f"{batch_id}.3"]
        assert request_status(run.state, "r9") == ("sealed", f"{batch_id}.3")

    def test_the_request_that_fills_a_batch_seals_it_in_parts(self) -> None:
        """A full seal decided with a request is split in that same decision."""
        run = Run(config(max_seal_bytes=BOUND, max_batch_size=6))
        run(*(request(n, tags=big_tags(n)) for n in range(5)))

        events = run(request(5, tags=big_tags(5)))

        parts = seals(events)
        assert [type(e) for e in events] == [MachineRequested, BatchSealed, BatchSealed]
        assert [len(p.request_ids) for p in parts] == [4, 2]
        assert {p.reason for p in parts} == {"full"}

    def test_shutdown_seals_in_parts_too(self) -> None:
        """What a stop seals fits as well."""
        run = Run(config(max_seal_bytes=BOUND))
        run(*(request(n, tags=big_tags(n)) for n in range(6)))

        parts = seals(run(Shutdown(T0 + timedelta(milliseconds=10))))

        assert [len(p.request_ids) for p in parts] == [4, 2]
        assert all(size_of(p) <= BOUND for p in parts)

    def test_the_count_limit_still_holds_within_the_size_bound(self) -> None:
        """Small requests are cut by max_batch_size as before, the size bound being far off."""
        run = Run(config(max_seal_bytes=BOUND, max_batch_size=50))
        run(*(request(n) for n in range(12)))
        run.config = config(max_seal_bytes=BOUND, max_batch_size=5)

        parts = seals(run(Tick(T0 + IDLE)))

        assert [len(p.request_ids) for p in parts] == [5, 5, 2]

    def test_outcomes_are_recorded_against_each_part(self) -> None:
        """Each part takes its own outcomes, as any sealed batch does."""
        run = Run(config(max_seal_bytes=BOUND))
        run(*(request(n, tags=big_tags(n)) for n in range(6)))
        parts = seals(run(Tick(T0 + IDLE)))

        for part in parts:
            decide_and_fold(run, RecordBatchOutcomes(part.batch_id, part.request_ids, at=T0 + IDLE))

        assert {request_status(run.state, f"r{n}") for n in range(6)} == {
            ("created", parts[0].batch_id),
            ("created", parts[1].batch_id),
        }

    def test_replaying_the_parts_rebuilds_the_same_state(self) -> None:
        """evolve over the recorded parts gives the state decide left behind."""
        run = Run(config(max_seal_bytes=BOUND))
        run(*(request(n, tags=big_tags(n)) for n in range(10)))
        run(Tick(T0 + IDLE), request(20, at=T0 + 2 * IDLE))

        replayed = initial_state()
        for event in run.events:
            replayed = evolve(replayed, event)

        assert replayed == run.state


def decide_and_fold(run: Run, command: RecordBatchOutcomes) -> None:
    for event in decide(run.state, command, run.config):
        run.state = evolve(run.state, event)


class TestRequestTooLargeToSeal:
    def test_is_refused_naming_its_tags_and_the_bound(self) -> None:
        """A request whose seal alone would be over the bound is refused, nothing decided."""
        run = Run(config(max_seal_bytes=BOUND))
        huge = request(1, tags=big_tags(1, count=50, width=256))

        with pytest.raises(InvalidCommand, match=rf"^tags too large to seal.*{BOUND}"):
            run(huge)
        assert run.events == []

    def test_the_others_keep_going(self) -> None:
        """Requests before and after the refused one are accepted and sealed."""
        run = Run(config(max_seal_bytes=BOUND))
        run(request(1, tags=big_tags(1)))
        with pytest.raises(InvalidCommand):
            run(request(2, tags=big_tags(2, count=50, width=256)))
        run(request(3, tags=big_tags(3)))

        parts = seals(run(Tick(T0 + IDLE)))

        assert [p.request_ids for p in parts] == [("r1", "r3")]
        assert request_status(run.state, "r2") is None

    def test_a_skip_request_is_refused_alike(self) -> None:
        """Sealed at once or not, a request over the bound is refused."""
        run = Run(config(max_seal_bytes=BOUND))

        with pytest.raises(InvalidCommand, match="tags too large to seal"):
            run(request(1, tags=big_tags(1, count=50, width=256), skip=True))

    def test_a_template_too_large_is_named(self) -> None:
        """When the template is the larger part, the refusal names the template."""
        wide = MachineTemplate(
            vm_size="Standard_D4s_v5",
            kubelet_config=tuple((f"setting{i:02d}", "x" * 256) for i in range(32)),
        )
        run = Run(config(max_seal_bytes=4096))

        with pytest.raises(InvalidCommand, match=r"^template too large to seal"):
            run(request(1, template=wide))

    def test_a_request_exactly_at_the_bound_is_accepted(self) -> None:
        """The bound is inclusive: a seal of exactly max_seal_bytes fits."""
        command = request(1, tags=big_tags(1))
        exact = seal_size(D4, [machine_of(command)])
        run = Run(config(max_seal_bytes=exact))

        run(command)
        with pytest.raises(InvalidCommand):
            Run(config(max_seal_bytes=exact - 1))(command)


class TestConfig:
    @pytest.mark.parametrize("bad", [0, -1, True, 1.5])
    def test_max_seal_bytes_must_be_a_positive_integer(self, bad: object) -> None:
        """A bound that cannot hold anything is refused at construction."""
        with pytest.raises(InvalidCommand, match="max_seal_bytes must be a positive integer"):
            config(max_seal_bytes=bad)  # type: ignore[arg-type]

    def test_no_bound_by_default(self) -> None:
        """The default configuration bounds seals by count only."""
        assert GrouperConfig.default().max_seal_bytes is None


# -- the bound against the encoded events --------------------------------------------------------

# Any text a request may carry once validated: no control characters nor lone surrogates, and
# plenty of what costs more than a byte (quotes, backslashes, accents, emoji).
_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from('"\\é€😀ab-'),
        st.characters(blacklist_categories=("Cc", "Cs")),
    ),
    max_size=40,
)
_MACHINES = st.lists(
    st.builds(
        BatchMachine,
        request_id=_TEXT.filter(bool),
        machine_name=st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True),
        zones=st.lists(st.sampled_from(["1", "2", "3"]), max_size=3, unique=True).map(tuple),
        tags=st.lists(st.tuples(_TEXT.filter(bool), _TEXT), max_size=5).map(tuple),
    ),
    min_size=1,
    max_size=8,
)


def encoded_size(event: object) -> int:
    """The bytes of an event's data in the log: canonical JSON in UTF-8, as the store writes."""
    _, _, data = to_data(event)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8"))


def carriers(machines: tuple[BatchMachine, ...]) -> list[object]:
    """Every event that carries the machines whole: the seal, the batch's opening, dispatches
    with the header and with per-machine calls (as the coordinator writes them)."""
    digest = template_hash(D4)
    sealed = BatchSealed(
        "b-00000001", digest, D4, tuple(m.request_id for m in machines), machines, "full", T0
    )
    request_ids = tuple(m.request_id for m in machines)
    return [
        sealed,
        BatchOpened("b-00000001", digest, D4, machines, "full", T0, 3, T0),
        BatchDispatched(
            "b-00000001",
            1,
            request_ids,
            ("create_batch b-00000001: BatchPutMachine",),
            encode_batch_put_machine_header(machines),
            T0,
        ),
        BatchDispatched(
            "b-00000001",
            1,
            request_ids,
            tuple(f"create {m.machine_name} (create-only PUT)" for m in machines),
            None,
            T0,
        ),
    ]


class TestSealSizeBoundsTheEvents:
    @settings(max_examples=200, deadline=None)
    @given(machines=_MACHINES)
    def test_the_machines_take_no_more_than_the_bound_in_any_event(
        self, machines: list[BatchMachine]
    ) -> None:
        """In the seal, the opening and both kinds of dispatch, what the machines add to the
        event (over the same event without them) is within seal_size's share for them."""
        held = tuple(machines)
        share = seal_size(D4, held) - seal_size(D4, ())

        for with_them, without in zip(carriers(held), carriers(()), strict=True):
            assert encoded_size(with_them) - encoded_size(without) <= share

    @pytest.mark.parametrize("text", ['"' * 256, "\\" * 256, "😀" * 256, 'é"' * 128])
    def test_the_costliest_text_is_within_the_bound(self, text: str) -> None:
        """Fifty tags of the text JSON makes the longest (escaped twice in the header, or four
        bytes a character) still fit the machines' share."""
        machines = (
            BatchMachine(
                text[:128], "m-1", ("1", "2", "3"), tuple((f"{i}{text}", text) for i in range(50))
            ),
            BatchMachine("r-2", "m-2"),
        )
        share = seal_size(D4, machines) - seal_size(D4, ())

        for with_them, without in zip(carriers(machines), carriers(()), strict=True):
            assert encoded_size(with_them) - encoded_size(without) <= share

    def test_the_template_is_counted_as_encoded(self) -> None:
        """The template's share is its encoded size, so a larger template leaves less room."""
        wide = MachineTemplate(vm_size="Standard_D4s_v5", kubelet_config=(("a", "é" * 300),))
        seal = BatchSealed("b-1", template_hash(D4), D4, (), (), "full", T0)
        wide_seal = BatchSealed("b-1", template_hash(D4), wide, (), (), "full", T0)

        assert seal_size(wide, ()) - seal_size(D4, ()) == encoded_size(wide_seal) - encoded_size(
            seal
        )

    def test_the_bound_is_close_for_ordinary_requests(self) -> None:
        """For requests with plain tags the bound is within a third of the largest event, so
        ordinary batches are not cut into needless parts."""
        machines = tuple(machine_of(request(n, tags=big_tags(n, width=40))) for n in range(50))

        largest = max(encoded_size(e) for e in carriers(machines))

        assert seal_size(D4, machines) <= largest * 4 / 3
