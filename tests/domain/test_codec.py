"""The event codec: stable registered names, JSON-ready data, exact round trips, strict decoding."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# Imported for its registration: the machines adapter records throttling waits in a batch's
# stream (``vm.BatchThrottled``), so the pinned names below hold whatever ran first.
import fleetledger.adapters.machines  # noqa: F401
from fleetledger.domain import codec
from fleetledger.domain.codec import (
    CodecError,
    event_type_of,
    from_data,
    register_event,
    registered_event_types,
    to_data,
)
from fleetledger.domain.machines import BatchMachine, BatchSealed, MachineFailed, MachineRequested
from fleetledger.domain.nodes import Bounds, VmPodReserved
from fleetledger.domain.template import MachineTemplate, template_hash

T0 = datetime(2025, 1, 1, 12, 30, 15, 123456, tzinfo=UTC)
TEMPLATE = MachineTemplate(
    vm_size="Standard_D4s_v5", max_pods=110, kubelet_config=(("cpuManagerPolicy", "static"),)
)

# The stored names are a contract with every event already in a log: never rename one.
VM_EVENTS = {
    "vm.MachineRequested": 1,
    "vm.BatchSealed": 1,
    "vm.BatchOutcomesRecorded": 1,
    "vm.BatchOpened": 1,
    "vm.BatchDispatched": 1,
    "vm.MachineCreated": 1,
    "vm.MachineFailed": 1,
    "vm.MachineNotFound": 1,
    "vm.MachineCreateAccepted": 1,
    "vm.BatchCompleted": 1,
    "vm.BatchThrottled": 1,
}


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    """Lets a test register throw-away events, then restores the registry as it was."""
    by_name, by_class = dict(codec._BY_NAME), dict(codec._BY_CLASS)
    yield
    codec._BY_NAME.clear()
    codec._BY_NAME.update(by_name)
    codec._BY_CLASS.clear()
    codec._BY_CLASS.update(by_class)


# -- strategies derived from the event classes, so a newly registered event is covered too -------

_TEXT = st.text(max_size=12)
_UTC_TIMES = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_TEMPLATES = st.builds(
    MachineTemplate,
    vm_size=st.text(min_size=1, max_size=12),
    priority=st.sampled_from(("spot", "regular")),
    max_pods=st.none() | st.integers(1, 250),
    kubelet_config=st.dictionaries(_TEXT, _TEXT, max_size=3).map(
        lambda d: tuple(sorted(d.items()))
    ),
    enable_fips=st.booleans(),
    os_sku=st.none() | _TEXT,
)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy_for(a) for a in args))
    if tp is type(None):
        return st.none()
    if tp is str:
        return _TEXT
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(-(2**53), 2**53)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if tp is datetime:
        return _UTC_TIMES
    if tp is MachineTemplate:
        return _TEMPLATES
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(strategy_for(args[0]), max_size=4).map(tuple)
        return st.tuples(*(strategy_for(a) for a in args))
    if origin in (Mapping, dict):
        return st.dictionaries(_TEXT, strategy_for(args[1]), max_size=3)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(tp)}
        return st.builds(tp, **fields)
    raise AssertionError(f"no strategy for {tp!r}; extend strategy_for")


def any_registered_event() -> st.SearchStrategy[Any]:
    return st.one_of(*(strategy_for(t.cls) for _, t in sorted(registered_event_types().items())))


class TestRegistry:
    def test_vm_event_names_and_versions_are_pinned(self) -> None:
        """Every VM-batching event is registered under its pinned name and version."""
        registered = {
            name: t.schema_version
            for name, t in registered_event_types().items()
            if name.startswith("vm.")
        }
        assert registered == VM_EVENTS

    def test_event_type_of_an_instance(self) -> None:
        """An event knows its registration."""
        event = MachineFailed("b", "r", "m", "throttled", "slow down", True, 3.0, T0)
        registered = event_type_of(event)
        assert (registered.name, registered.schema_version) == ("vm.MachineFailed", 1)

    def test_unregistered_class_is_refused(self) -> None:
        """Encoding something that is not a registered event fails clearly."""
        with pytest.raises(CodecError, match="not a registered event"):
            to_data(TEMPLATE)

    @pytest.mark.usefixtures("scratch_registry")
    def test_register_event_as_a_decorator(self) -> None:
        """A new aggregate registers its events with the decorator and gets a codec for free."""

        @register_event("test.SlotClaimed", 2)
        @dataclasses.dataclass(frozen=True, slots=True)
        class SlotClaimed:
            slot: int
            by: str | None
            at: datetime

        event = SlotClaimed(3, None, T0)
        name, version, data = to_data(event)
        assert (name, version, data) == (
            "test.SlotClaimed",
            2,
            {"slot": 3, "by": None, "at": "2025-01-01T12:30:15.123456+00:00"},
        )
        assert from_data(name, version, data) == event

    @pytest.mark.usefixtures("scratch_registry")
    def test_registering_twice_the_same_way_is_harmless(self) -> None:
        """Re-registering a class under its own name and version is a no-op."""
        register_event("vm.MachineRequested", 1)(MachineRequested)
        assert registered_event_types()["vm.MachineRequested"].cls is MachineRequested

    @pytest.mark.usefixtures("scratch_registry")
    def test_a_name_cannot_be_taken_twice(self) -> None:
        """Another class cannot take a registered name, nor a class a second name."""

        @dataclasses.dataclass(frozen=True)
        class Impostor:
            at: datetime

        with pytest.raises(CodecError, match=r"is registered as vm\.MachineRequested"):
            register_event("vm.MachineRequested")(Impostor)
        with pytest.raises(CodecError, match=r"is registered as vm\.BatchSealed"):
            register_event("vm.BatchSealedAgain")(BatchSealed)

    @pytest.mark.usefixtures("scratch_registry")
    @pytest.mark.parametrize("name", ["MachineRequested", "vm.machineRequested", "VM.X", "vm."])
    def test_malformed_names_are_refused(self, name: str) -> None:
        """Names look like 'context.EventName'."""

        @dataclasses.dataclass(frozen=True)
        class Something:
            at: datetime

        with pytest.raises(CodecError, match=r"context\.EventName"):
            register_event(name)(Something)

    @pytest.mark.usefixtures("scratch_registry")
    def test_only_frozen_dataclasses_can_be_events(self) -> None:
        """Mutable classes are refused at registration."""

        @dataclasses.dataclass
        class Mutable:
            at: datetime

        with pytest.raises(CodecError, match="frozen dataclass"):
            register_event("test.Mutable")(Mutable)

    @pytest.mark.usefixtures("scratch_registry")
    def test_unsupported_field_types_are_refused_at_registration(self) -> None:
        """A field the codec cannot encode fails when registering, not on first write."""

        @dataclasses.dataclass(frozen=True)
        class Slow:
            wait: timedelta

        with pytest.raises(CodecError, match=r"Slow\.wait: unsupported field type"):
            register_event("test.Slow")(Slow)


class TestRoundTrip:
    @settings(max_examples=300, deadline=None)
    @given(any_registered_event())
    def test_every_registered_event_round_trips_through_json(self, event: Any) -> None:
        """to_data -> json -> from_data gives back an equal event, for every registered type."""
        name, version, data = to_data(event)
        assert from_data(name, version, json.loads(json.dumps(data))) == event

    @settings(max_examples=50, deadline=None)
    @given(any_registered_event())
    def test_reencoding_gives_the_same_data(self, event: Any) -> None:
        """Decoding, then encoding again, reproduces the stored data exactly."""
        name, version, data = to_data(event)
        stored = json.dumps(data, sort_keys=True)
        again = to_data(from_data(name, version, json.loads(stored)))
        assert json.dumps(again[2], sort_keys=True) == stored

    def test_sealed_batch_data_shape(self) -> None:
        """Datetimes become UTC ISO text, tuples lists, the template and machines objects."""
        sealed = BatchSealed(
            "b-1",
            template_hash(TEMPLATE),
            TEMPLATE,
            ("r1",),
            (BatchMachine("r1", "m1", ("1", "2"), (("team", "a"),)),),
            "idle",
            T0,
        )
        name, version, data = to_data(sealed)
        assert (name, version) == ("vm.BatchSealed", 1)
        assert data["at"] == "2025-01-01T12:30:15.123456+00:00"
        assert data["request_ids"] == ["r1"]
        assert data["machines"] == [
            {"request_id": "r1", "machine_name": "m1", "zones": ["1", "2"], "tags": [["team", "a"]]}
        ]
        assert data["template"] == TEMPLATE.to_data()

    def test_times_in_other_offsets_are_written_in_utc(self) -> None:
        """A time with an offset is stored as the same instant in UTC."""
        event = MachineFailed(
            "b", "r", "m", "unknown", "?", False, None, T0.astimezone(timezone(timedelta(hours=5)))
        )
        _, _, data = to_data(event)
        assert data["at"] == "2025-01-01T12:30:15.123456+00:00"


class TestFastDecoding:
    """The fast path of from_data: what it takes, and what it leaves to the generic decoders."""

    @settings(max_examples=300, deadline=None)
    @given(any_registered_event())
    def test_every_event_s_own_data_takes_the_fast_path(self, event: Any) -> None:
        """What to_data writes decodes on the fast path, to an equal event of the same class."""
        name, _, data = to_data(event)
        decoded = codec._BY_NAME[name].fast(json.loads(json.dumps(data)))
        assert decoded is not codec._SLOW
        assert type(decoded) is type(event)
        assert decoded == event

    @pytest.mark.parametrize(
        "change",
        [
            {"extra": 1},
            {"code": "meltdown"},
            {"retryable": 1},
            {"retry_after_seconds": True},
            {"at": "2025-01-01T00:00:00"},
            {"at": "yesterday"},
            {"message": 5},
        ],
    )
    def test_data_it_does_not_take_is_left_to_the_generic_decoders(
        self, change: dict[str, object]
    ) -> None:
        """Anything off the exact shape comes back as _SLOW, for from_data to refuse."""
        event = MachineFailed("b", "r", "m", "throttled", "slow down", True, 2.5, T0)
        data = {**to_data(event)[2], **change}
        assert codec._BY_NAME["vm.MachineFailed"].fast(data) is codec._SLOW
        with pytest.raises(CodecError):
            from_data("vm.MachineFailed", 1, data)

    def test_a_field_left_to_its_default_still_decodes(self) -> None:
        """Data without an optional field leaves the fast path and decodes with the default."""
        bounds = Bounds(250, 500, 1000)
        _, _, data = to_data(VmPodReserved("vm-1", bounds, bounds, 0, 500, 500, False, T0))
        del data["scaling_enabled"]
        assert codec._BY_NAME["nodes.VmPodReserved"].fast(data) is codec._SLOW
        decoded = from_data("nodes.VmPodReserved", 1, data)
        assert isinstance(decoded, VmPodReserved)
        assert decoded.scaling_enabled is True


class TestStrictDecoding:
    def good(self) -> dict[str, object]:
        event = MachineFailed("b", "r", "m", "throttled", "slow down", True, 2.5, T0)
        return to_data(event)[2]

    def test_unknown_type(self) -> None:
        """An unregistered type name is refused with a hint."""
        with pytest.raises(CodecError, match="unknown event type"):
            from_data("vm.Nope", 1, {})

    def test_other_schema_version(self) -> None:
        """Only the current schema version decodes; older ones need an upcaster."""
        with pytest.raises(CodecError, match="upcaster"):
            from_data("vm.MachineFailed", 2, self.good())

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            ({"extra": 1}, "unknown field"),
            ({"code": None}, "expected one of"),
            ({"code": "meltdown"}, "expected one of"),
            ({"retryable": 1}, "true or false"),
            ({"retry_after_seconds": "soon"}, "expected a number"),
            ({"retry_after_seconds": True}, "expected a number"),
            ({"at": "2025-01-01T00:00:00"}, "no UTC offset"),
            ({"at": "yesterday"}, "field 'at'"),
            ({"message": 5}, "expected text"),
        ],
    )
    def test_bad_field_values(self, change: dict[str, object], message: str) -> None:
        """Wrong types, values outside a Literal and naive times are refused, naming the field."""
        with pytest.raises(CodecError, match=message):
            from_data("vm.MachineFailed", 1, {**self.good(), **change})

    def test_missing_field(self) -> None:
        """A field without a default must be present."""
        data = self.good()
        del data["request_id"]
        with pytest.raises(CodecError, match="missing field"):
            from_data("vm.MachineFailed", 1, data)

    def test_integer_is_accepted_for_a_float(self) -> None:
        """JSON writers may drop the '.0'; the value still decodes as a float."""
        event = from_data("vm.MachineFailed", 1, {**self.good(), "retry_after_seconds": 3})
        assert isinstance(event, MachineFailed)
        assert event.retry_after_seconds == 3.0
        assert isinstance(event.retry_after_seconds, float)

    def test_bad_nested_template(self) -> None:
        """An invalid template inside an event is reported as a codec error."""
        _, _, data = to_data(
            MachineRequested("r", "m", TEMPLATE, template_hash(TEMPLATE), (), (), False, "b", T0)
        )
        bad = {**data, "template": {"vm_size": "x", "typo": 1}}
        with pytest.raises(CodecError, match="field 'template'"):
            from_data("vm.MachineRequested", 1, bad)

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            (
                lambda m: m[0].update(machine_name=5),
                r"'machines'\[0\]\.machine_name: expected text",
            ),
            (lambda m: m[1]["zones"].append(2), r"'machines'\[1\]\.zones\[2\]: expected text"),
            (lambda m: m[1]["tags"][0].pop(), r"'machines'\[1\]\.tags\[0\]: expected a list of 2"),
            (lambda m: m[1].update(typo=1), r"'machines'\[1\]: unknown \['typo'\], missing -"),
        ],
    )
    def test_a_bad_value_deep_inside_names_its_path(
        self, change: typing.Callable[[list[dict[str, Any]]], object], message: str
    ) -> None:
        """Inside lists and nested objects, the refusal names the item and the field."""
        machines = (
            BatchMachine("r1", "m1", ("1",), ()),
            BatchMachine("r2", "m2", ("1", "2"), (("team", "a"),)),
        )
        sealed = BatchSealed("b-1", "h", TEMPLATE, ("r1", "r2"), machines, "idle", T0)
        _, _, data = to_data(sealed)
        bad = json.loads(json.dumps(data))
        change(bad["machines"])

        with pytest.raises(CodecError, match=r"vm\.BatchSealed v1: field " + message):
            from_data("vm.BatchSealed", 1, bad)

    def test_naive_time_cannot_be_encoded(self) -> None:
        """Events with naive datetimes are refused when encoding."""
        event = MachineFailed("b", "r", "m", "unknown", "?", False, None, datetime(2025, 1, 1))
        with pytest.raises(CodecError, match="naive datetime"):
            to_data(event)
