"""Event type names and the pure codec between domain events and JSON-ready data.

Every event that reaches the log is registered here, in one place, under a stable, versioned name
(``"vm.MachineRequested"``, schema version 1). The class name can change; the registered name must
not. A change to an event's fields that old data cannot satisfy gets a new schema version and an
upcaster in the event store (docs/ARCHITECTURE.md, "The log") — this module decodes only the current
version of each type.

Encoding is driven by the dataclass field types, so a new event needs no codec code:

=============================  ===============================================================
field type                     JSON form
=============================  ===============================================================
``str``, ``int``, ``bool``     itself (an ``int`` field refuses ``true``/``false``)
``float``                      number (an integer is accepted when decoding)
``datetime``                   ISO-8601 text in UTC, e.g. ``"2025-01-02T03:04:05.000006+00:00"``;
                               naive datetimes are refused both ways
``Literal[...]``               the value, checked against the allowed ones when decoding
``X | None``                   ``null`` or the form of ``X``
``tuple[X, ...]``, tuples      list
``Mapping[str, X]``            object
a type with ``to_data`` and    whatever ``to_data`` returns (``MachineTemplate``)
``from_data``
another frozen dataclass       object of its fields
=============================  ===============================================================

Unsupported field types are refused when the event is registered, not when it is first written.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from fleetledger.domain import ipam
from fleetledger.domain.frozen import positional
from fleetledger.domain.leadership import LeaderElected
from fleetledger.domain.machines import (
    BatchCompleted,
    BatchDispatched,
    BatchOpened,
    BatchOutcomesRecorded,
    BatchSealed,
    MachineCreateAccepted,
    MachineCreated,
    MachineFailed,
    MachineNotFound,
    MachineRequested,
)
from fleetledger.domain.nodes import (
    ComputeUnitMismatch,
    ComputeUnitViolated,
    ControllerRestarted,
    MigrationStarted,
    NodeCapacityChanged,
    NodeConfigChanged,
    NodeJoined,
    NodeLeft,
    OtherPodReserved,
    OtherPodsReserved,
    PodDeleted,
    ResourcesGranted,
    VmLimitsChanged,
    VmMigrationChanged,
    VmPodReserved,
    VmScalingChanged,
    VmUseChanged,
)
from fleetledger.domain.placement import workloads
from fleetledger.domain.testbeds import batch_job, scheduling, testbed

__all__ = [
    "CodecError",
    "EventType",
    "event_type_of",
    "from_data",
    "register_event",
    "registered_event_types",
    "to_data",
]

_T = TypeVar("_T")
_Encode = Callable[[Any], object]
_Decode = Callable[[object], Any]

# "<context>.<EventName>": a lower-case context, then the event's name in PascalCase.
_TYPE_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*\.[A-Z][A-Za-z0-9]*$")


class CodecError(ValueError):
    """An event cannot be encoded or decoded, or a registration conflicts with another."""


class _Invalid(Exception):
    """A value a decoder refuses: why, and where below the field being decoded (``[2].name``).

    The decoders name no place while they succeed: the path is assembled only on the way out of
    a failure, each container adding its step. Formatting a path for every value decoded, just
    in case, cost more than the decoding (a ``ClusterObserved`` of a hundred pods, read by every
    extender on every change of the cluster).
    """

    def __init__(self, reason: str, path: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path

    def within(self, step: str) -> _Invalid:
        """The same refusal seen from the container one ``step`` up."""
        return _Invalid(self.reason, step + self.path)


@dataclasses.dataclass(frozen=True, slots=True)
class EventType:
    """A registered event: its class, stable name and current schema version."""

    cls: type
    name: str
    schema_version: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    event_type: EventType
    encoders: tuple[tuple[str, _Encode | None], ...]
    """Each field's encoder, ``None`` for a value JSON takes as it is (most of them: a call
    per field saved on every event encoded)."""
    decoders: Mapping[str, _Decode]
    required: frozenset[str]
    fast: _Decode
    """The event's fast decoder (see "fast decoders" below), tried first."""


_BY_NAME: dict[str, _Plan] = {}
_BY_CLASS: dict[type, _Plan] = {}


def register_event(type_name: str, schema_version: int = 1) -> Callable[[type[_T]], type[_T]]:
    """Register a frozen dataclass as an event under ``type_name``; usable as a decorator.

    Registering the same class under the same name and version again is a no-op; any other
    reuse of a name or a class is an error, so two events can never share a stored name.
    """

    def register(cls: type[_T]) -> type[_T]:
        _register(cls, type_name, schema_version)
        return cls

    return register


def _register(cls: type, type_name: str, schema_version: int) -> None:
    if not _TYPE_NAME.match(type_name):
        raise CodecError(
            f"event type name {type_name!r} must look like 'context.EventName', "
            "e.g. 'vm.MachineRequested'"
        )
    if type(schema_version) is not int or schema_version < 1:
        raise CodecError(f"schema_version must be a positive integer, got {schema_version!r}")
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise CodecError(f"{cls.__qualname__} must be a frozen dataclass to be an event")
    wanted = EventType(cls, type_name, schema_version)
    for existing in (_BY_NAME.get(type_name), _BY_CLASS.get(cls)):
        if existing is not None and existing.event_type != wanted:
            raise CodecError(
                f"cannot register {cls.__qualname__} as {type_name} v{schema_version}: "
                f"{existing.event_type.cls.__qualname__} is registered as "
                f"{existing.event_type.name} v{existing.event_type.schema_version}"
            )
    plan = _plan_for(wanted)
    _BY_NAME[type_name] = plan
    _BY_CLASS[cls] = plan


def registered_event_types() -> Mapping[str, EventType]:
    """Every registered event by type name (a copy)."""
    return {name: plan.event_type for name, plan in sorted(_BY_NAME.items())}


def event_type_of(event: object) -> EventType:
    """The registration of ``event``'s class; :class:`CodecError` if it has none."""
    plan = _BY_CLASS.get(type(event))
    if plan is None:
        raise CodecError(f"{type(event).__qualname__} is not a registered event")
    return plan.event_type


def to_data(event: object) -> tuple[str, int, dict[str, object]]:
    """``(type_name, schema_version, data)``; ``data`` is JSON-ready (``json.dumps`` takes it)."""
    plan = _BY_CLASS.get(type(event))
    if plan is None:
        raise CodecError(f"{type(event).__qualname__} is not a registered event")
    data: dict[str, object] = {}
    for name, encode in plan.encoders:
        if encode is None:
            data[name] = getattr(event, name)
            continue
        try:
            data[name] = encode(getattr(event, name))
        except CodecError as e:
            raise CodecError(f"{plan.event_type.name}: field {name!r}: {e}") from e
    return plan.event_type.name, plan.event_type.schema_version, data


def from_data(type_name: str, schema_version: int, data: Mapping[str, object]) -> object:
    """Rebuild the event that :func:`to_data` encoded; strict about names, versions and fields."""
    plan = _BY_NAME.get(type_name)
    if plan is None:
        raise CodecError(f"unknown event type {type_name!r}; is the module that defines it loaded?")
    if schema_version == plan.event_type.schema_version:
        event = plan.fast(data)
        if event is not _SLOW:
            return event
    # Data the fast decoder left: the checks below are set comparisons of the keys views, and
    # the error texts are built only on the way out.
    if schema_version != plan.event_type.schema_version:
        raise CodecError(
            f"{type_name} v{schema_version}: this code reads v{plan.event_type.schema_version}; "
            "register an upcaster in the event store for older versions"
        )
    if not isinstance(data, Mapping):
        raise CodecError(
            f"{type_name} v{schema_version}: data must be an object, got {type(data).__name__}"
        )
    decoders = plan.decoders
    keys = data.keys()
    if not (keys <= decoders.keys() and keys >= plan.required):
        label = f"{type_name} v{schema_version}"
        unknown = sorted(set(keys) - set(decoders))
        if unknown:
            raise CodecError(f"{label}: unknown field(s) {', '.join(unknown)}")
        missing = sorted(plan.required - set(keys))
        raise CodecError(f"{label}: missing field(s) {', '.join(missing)}")
    values: dict[str, object] = {}
    for name, raw in data.items():
        try:
            values[name] = decoders[name](raw)
        except _Invalid as e:
            # What the value failed on (a time's parser, a custom type's own check), if anything.
            raise CodecError(
                f"{type_name} v{schema_version}: field {name!r}{e.path}: {e.reason}"
            ) from e.__cause__
    return plan.event_type.cls(**values)


# -- compiling field types into encoders and decoders --------------------------------------------


def _plan_for(event_type: EventType) -> _Plan:
    cls = event_type.cls
    hints = typing.get_type_hints(cls)
    encoders: list[tuple[str, _Encode | None]] = []
    decoders: dict[str, _Decode] = {}
    required: set[str] = set()
    for f in dataclasses.fields(cls):
        try:
            encode = _encoder(hints[f.name])
            encoders.append((f.name, None if encode is _identity else encode))
            decoders[f.name] = _decoder(hints[f.name])
        except CodecError as e:
            raise CodecError(f"{cls.__qualname__}.{f.name}: {e}") from e
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.add(f.name)
    fast = _fast_dataclass(cls)
    return _Plan(event_type, tuple(encoders), decoders, frozenset(required), fast)


def _is_optional(tp: object) -> tuple[bool, object]:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return True, rest[0]
        raise CodecError(f"unions other than 'X | None' are not supported: {tp!r}")
    return False, tp


def _identity(value: object) -> object:
    return value


def _encode_datetime(value: datetime) -> str:
    if value.tzinfo is UTC:
        return value.isoformat()  # nearly every time: already UTC, nothing to convert
    if value.utcoffset() is None:
        raise CodecError(f"naive datetime {value!r}; events carry timezone-aware UTC times")
    return value.astimezone(UTC).isoformat()


def _encoder(tp: object) -> _Encode:
    optional, inner = _is_optional(tp)
    if optional:
        encode_inner = _encoder(inner)
        return lambda value: None if value is None else encode_inner(value)
    origin = typing.get_origin(inner)
    args = typing.get_args(inner)
    if inner in (str, int, bool, float) or origin is typing.Literal:
        return _identity
    if inner is datetime:
        return _encode_datetime
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _encoder(args[0])
            return lambda value: [item(v) for v in value]
        items = [_encoder(a) for a in args]
        return lambda value: [encode(v) for encode, v in zip(items, value, strict=True)]
    if origin in (Mapping, dict) and args and args[0] is str:
        item = _encoder(args[1])
        return lambda value: {k: item(v) for k, v in value.items()}
    if isinstance(inner, type) and hasattr(inner, "to_data") and hasattr(inner, "from_data"):
        return lambda value: value.to_data()
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        hints = typing.get_type_hints(inner)
        fields = [(f.name, _encoder(hints[f.name])) for f in dataclasses.fields(inner)]
        return lambda value: {name: encode(getattr(value, name)) for name, encode in fields}
    raise CodecError(f"unsupported field type {inner!r}")


def _decoder(tp: object) -> _Decode:
    optional, inner = _is_optional(tp)
    if optional:
        decode_inner = _decoder(inner)
        return lambda raw: None if raw is None else decode_inner(raw)
    origin = typing.get_origin(inner)
    args = typing.get_args(inner)
    if inner is str:
        return _decode_str
    if inner is bool:
        return _decode_bool
    if inner is int:
        return _decode_int
    if inner is float:

        def decode_float(raw: object) -> float:
            if isinstance(raw, bool) or not isinstance(raw, int | float):
                raise _Invalid(f"expected a number, got {raw!r}")
            return float(raw)

        return decode_float
    if origin is typing.Literal:
        allowed = args

        def decode_literal(raw: object) -> object:
            if raw not in allowed or type(raw) not in {type(a) for a in allowed}:
                raise _Invalid(f"expected one of {list(allowed)!r}, got {raw!r}")
            return raw

        return decode_literal
    if inner is datetime:
        return _decode_datetime
    if origin is tuple:
        return _tuple_decoder(args)
    if origin in (Mapping, dict) and args and args[0] is str:
        item_decoder = _decoder(args[1])

        def decode_mapping(raw: object) -> dict[str, object]:
            if not isinstance(raw, dict):
                raise _Invalid(f"expected an object, got {raw!r}")
            decoded: dict[str, object] = {}
            for k, v in raw.items():
                try:
                    decoded[str(k)] = item_decoder(v)
                except _Invalid as e:
                    raise e.within(f"[{k!r}]") from e.__cause__
            return decoded

        return decode_mapping
    if isinstance(inner, type) and hasattr(inner, "to_data") and hasattr(inner, "from_data"):
        return _custom_decoder(inner)
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        return _dataclass_decoder(inner)
    raise CodecError(f"unsupported field type {inner!r}")


# The leaves, one call each: most of a decoded event's values are these.


def _decode_str(raw: object) -> str:
    if isinstance(raw, str):
        return raw
    raise _Invalid(f"expected text, got {raw!r}")


def _decode_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    raise _Invalid(f"expected true or false, got {raw!r}")


def _decode_int(raw: object) -> int:
    if type(raw) is int:  # not a bool
        return raw
    raise _Invalid(f"expected an integer, got {raw!r}")


def _decode_datetime(raw: object) -> datetime:
    if not isinstance(raw, str):
        raise _Invalid(f"expected an ISO-8601 time, got {raw!r}")
    try:
        value = datetime.fromisoformat(raw)
    except ValueError as e:
        raise _Invalid(str(e)) from e
    if value.utcoffset() is None:
        raise _Invalid(f"time {raw!r} has no UTC offset")
    return value.astimezone(UTC)


def _tuple_decoder(args: tuple[object, ...]) -> _Decode:
    if len(args) == 2 and args[1] is Ellipsis:
        item = _decoder(args[0])

        def decode_variadic(raw: object) -> tuple[object, ...]:
            if not isinstance(raw, list):
                raise _Invalid(f"expected a list, got {raw!r}")
            try:
                return tuple([item(v) for v in raw])
            except _Invalid:
                # Which item: decoded again one by one, on this failure's path only.
                for i, v in enumerate(raw):
                    try:
                        item(v)
                    except _Invalid as at:
                        raise at.within(f"[{i}]") from at.__cause__
                raise  # pragma: no cover - a decoder that refuses a value once refuses it again

        return decode_variadic
    items = [_decoder(a) for a in args]

    def decode_fixed(raw: object) -> tuple[object, ...]:
        if not isinstance(raw, list) or len(raw) != len(items):
            raise _Invalid(f"expected a list of {len(items)}, got {raw!r}")
        decoded = []
        for i, (decode, v) in enumerate(zip(items, raw, strict=True)):
            try:
                decoded.append(decode(v))
            except _Invalid as e:
                raise e.within(f"[{i}]") from e.__cause__
        return tuple(decoded)

    return decode_fixed


def _custom_decoder(cls: type) -> _Decode:
    from_data_method = cls.from_data  # type: ignore[attr-defined]

    def decode_custom(raw: object) -> object:
        if not isinstance(raw, dict):
            raise _Invalid(f"expected an object, got {raw!r}")
        try:
            return from_data_method(raw)
        except (TypeError, ValueError) as e:
            raise _Invalid(str(e)) from e

    return decode_custom


def _dataclass_decoder(cls: type) -> _Decode:
    hints = typing.get_type_hints(cls)
    fields = {f.name: _decoder(hints[f.name]) for f in dataclasses.fields(cls)}
    names = frozenset(fields)
    required = frozenset(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )

    def decode_dataclass(raw: object) -> object:
        if not isinstance(raw, dict):
            raise _Invalid(f"expected an object, got {raw!r}")
        keys = raw.keys()
        if not (keys <= names and keys >= required):
            unknown = sorted(set(keys) - names)
            missing = sorted(required - set(keys))
            raise _Invalid(f"unknown {unknown or '-'}, missing {missing or '-'}")
        try:
            return cls(**{k: fields[k](v) for k, v in raw.items()})
        except _Invalid:
            for k, v in raw.items():
                try:
                    fields[k](v)
                except _Invalid as at:
                    raise at.within(f".{k}") from at.__cause__
            raise  # pragma: no cover - a decoder that refuses a value once refuses it again

    return decode_dataclass


# -- fast decoders ---------------------------------------------------------------------------------
# A replay decodes every event of the log, and the decoders above cost a call per value, a
# keyword dictionary per object and a frozen dataclass's ``__init__`` (one ``object.__setattr__``
# per field): most of the time a million-event replay spent in the read models
# (``fleetledger bench replay``). So each registered event also gets a decoder written out as
# Python source for its fields, the way ``dataclasses`` writes ``__init__``: every check inline,
# and the object built by writing its slots (see fleetledger.domain.frozen). It is only a fast
# path: it takes data with exactly the event's fields, each of exactly the type JSON gives, and
# returns _SLOW for anything else (a missing, unknown or optional field left out, a value of
# another type, a time that does not parse), which the decoders above then decode or refuse with
# their usual message. Both accept the same values and build equal objects
# (tests/domain/test_codec.py checks every event).

_SLOW: Final = object()
"""What a fast decoder returns for data it leaves to the decoders above."""


def _fast_time(raw: object) -> object:
    if type(raw) is not str:
        return _SLOW
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return _SLOW
    if value.tzinfo is UTC:
        return value  # what astimezone(UTC) returns for it
    if value.utcoffset() is None:
        return _SLOW
    return value.astimezone(UTC)


class _FastSource:
    """The source of one fast decoder being written, and the names it refers to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, object] = {"_SLOW": _SLOW}
        self._count = 0

    def fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}{self._count}"

    def refer(self, value: object, stem: str) -> str:
        name = self.fresh(f"_{stem}")
        self.names[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


def _emit_value(src: _FastSource, tp: object, raw: str, out: str, indent: int) -> None:
    """Lines binding ``out`` to the decoded ``raw`` of type ``tp``, or returning _SLOW."""
    optional, inner = _is_optional(tp)
    if optional:
        src.emit(indent, f"if {raw} is None:")
        src.emit(indent + 1, f"{out} = None")
        src.emit(indent, "else:")
        _emit_value(src, inner, raw, out, indent + 1)
    elif inner in (str, int, bool, float) or typing.get_origin(inner) is typing.Literal:
        _emit_scalar(src, inner, raw, out, indent)
    elif inner is datetime:
        _emit_time(src, raw, out, indent)
    elif typing.get_origin(inner) in (tuple, Mapping, dict):
        _emit_container(src, inner, raw, out, indent)
    elif isinstance(inner, type) and hasattr(inner, "to_data") and hasattr(inner, "from_data"):
        # Its own from_data checks it; a refusal is the slow path's to report.
        src.emit(indent, f"if type({raw}) is not dict:")
        src.emit(indent + 1, "return _SLOW")
        src.emit(indent, "try:")
        src.emit(indent + 1, f"{out} = {src.refer(inner.from_data, 'custom')}({raw})")
        src.emit(indent, "except (TypeError, ValueError):")
        src.emit(indent + 1, "return _SLOW")
    elif isinstance(inner, type) and dataclasses.is_dataclass(inner):
        _emit_call(src, src.refer(_fast_dataclass(inner), "object"), raw, out, indent)
    else:
        raise CodecError(f"unsupported field type {inner!r}")


def _emit_scalar(src: _FastSource, tp: object, raw: str, out: str, indent: int) -> None:
    if tp is float:
        src.emit(indent, f"if type({raw}) is float:")
        src.emit(indent + 1, f"{out} = {raw}")
        src.emit(indent, f"elif type({raw}) is int:")
        src.emit(indent + 1, f"{out} = float({raw})")
        src.emit(indent, "else:")
        src.emit(indent + 1, "return _SLOW")
        return
    if tp is bool:
        src.emit(indent, f"if {raw} is not True and {raw} is not False:")
    elif tp is str or tp is int:
        src.emit(indent, f"if type({raw}) is not {tp.__name__}:")
    else:  # a Literal: the kind first, as a list (unhashable) is never in the set
        args = typing.get_args(tp)
        kinds = src.refer(frozenset(type(a) for a in args), "kinds")
        allowed = src.refer(frozenset(args), "allowed")
        src.emit(indent, f"if type({raw}) not in {kinds} or {raw} not in {allowed}:")
    src.emit(indent + 1, "return _SLOW")
    src.emit(indent, f"{out} = {raw}")


# The types whose decoded value is the JSON value itself, when it is of exactly that type (an
# int field refuses a bool).
_AS_IN_JSON = (str, int, bool)


def _only(src: _FastSource, tp: type) -> str:
    """A name for a test that an iterable of types holds ``tp`` alone (nothing else)."""
    return src.refer(frozenset((tp,)).issuperset, f"only_{tp.__name__}")


def _emit_container(src: _FastSource, tp: object, raw: str, out: str, indent: int) -> None:
    args = typing.get_args(tp)
    # A container of values JSON holds as they are (IP addresses, request ids) is checked by
    # type in one pass over ``map(type, ...)``, in C, and copied whole: a line per item cost a
    # subnet's or a batch's events more than all their other fields.
    if typing.get_origin(tp) is not tuple and args and args[0] is str and args[1] in _AS_IN_JSON:
        src.emit(
            indent,
            f"if type({raw}) is not dict or not {_only(src, str)}(map(type, {raw})) "
            f"or not {_only(src, args[1])}(map(type, {raw}.values())):",
        )
        src.emit(indent + 1, "return _SLOW")
        src.emit(indent, f"{out} = dict({raw})")
        return
    if len(args) == 2 and args[1] is Ellipsis and args[0] in _AS_IN_JSON:
        only = _only(src, args[0])
        src.emit(indent, f"if type({raw}) is not list or not {only}(map(type, {raw})):")
        src.emit(indent + 1, "return _SLOW")
        src.emit(indent, f"{out} = tuple({raw})")
        return
    if typing.get_origin(tp) is not tuple:  # Mapping[str, X]
        if not args or args[0] is not str:
            raise CodecError(f"unsupported field type {tp!r}")
        key, item, decoded = src.fresh("key"), src.fresh("item"), src.fresh("decoded")
        src.emit(indent, f"if type({raw}) is not dict:")
        src.emit(indent + 1, "return _SLOW")
        src.emit(indent, f"{out} = {{}}")
        src.emit(indent, f"for {key}, {item} in {raw}.items():")
        src.emit(indent + 1, f"if type({key}) is not str:")
        src.emit(indent + 2, "return _SLOW")
        _emit_value(src, args[1], item, decoded, indent + 1)
        src.emit(indent + 1, f"{out}[{key}] = {decoded}")
    elif len(args) == 2 and args[1] is Ellipsis:
        item, decoded, items = src.fresh("item"), src.fresh("decoded"), src.fresh("items")
        src.emit(indent, f"if type({raw}) is not list:")
        src.emit(indent + 1, "return _SLOW")
        src.emit(indent, f"{items} = []")
        src.emit(indent, f"for {item} in {raw}:")
        _emit_value(src, args[0], item, decoded, indent + 1)
        src.emit(indent + 1, f"{items}.append({decoded})")
        src.emit(indent, f"{out} = tuple({items})")
    else:
        src.emit(indent, f"if type({raw}) is not list or len({raw}) != {len(args)}:")
        src.emit(indent + 1, "return _SLOW")
        parts = []
        for i, arg in enumerate(args):
            item, decoded = src.fresh("item"), src.fresh("decoded")
            src.emit(indent, f"{item} = {raw}[{i}]")
            _emit_value(src, arg, item, decoded, indent)
            parts.append(decoded)
        src.emit(indent, f"{out} = ({''.join(f'{part}, ' for part in parts)})")


def _emit_time(src: _FastSource, raw: str, out: str, indent: int) -> None:
    # Nearly every stored time is written in UTC, which fromisoformat returns with the UTC
    # singleton: that case inline (most events carry a time, and a call per event shows in a
    # replay), any other offset through _fast_time.
    parse, utc = src.refer(datetime.fromisoformat, "parse"), src.refer(UTC, "utc")
    src.emit(indent, f"if type({raw}) is not str:")
    src.emit(indent + 1, "return _SLOW")
    src.emit(indent, "try:")
    src.emit(indent + 1, f"{out} = {parse}({raw})")
    src.emit(indent, "except ValueError:")
    src.emit(indent + 1, "return _SLOW")
    src.emit(indent, f"if {out}.tzinfo is not {utc}:")
    _emit_call(src, src.refer(_fast_time, "time"), raw, out, indent + 1)


def _emit_call(src: _FastSource, decode: str, raw: str, out: str, indent: int) -> None:
    src.emit(indent, f"{out} = {decode}({raw})")
    src.emit(indent, f"if {out} is _SLOW:")
    src.emit(indent + 1, "return _SLOW")


_FAST_BY_CLASS: dict[type, _Decode] = {}


def _positional_or_none(cls: type) -> Callable[..., object] | None:
    """The constructor of ``cls`` writing its slots, or ``None``: such a class is called."""
    try:
        return positional(cls)
    except TypeError:
        return None


def _fast_dataclass(cls: type) -> _Decode:
    """The fast decoder of dataclass ``cls`` from an object holding exactly its fields."""
    found = _FAST_BY_CLASS.get(cls)
    if found is not None:
        return found
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    src = _FastSource()
    src.emit(0, "def decode(data):")
    src.emit(1, f"if type(data) is not dict or len(data) != {len(fields)}:")
    src.emit(2, "return _SLOW")
    # As many keys as fields, and every field found: exactly the fields.
    raws = [src.fresh("raw") for _ in fields]
    src.emit(1, "try:")
    for raw, f in zip(raws, fields, strict=True):
        src.emit(2, f"{raw} = data[{f.name!r}]")
    src.emit(1, "except KeyError:")
    src.emit(2, "return _SLOW")
    values = [src.fresh("value") for _ in fields]
    for raw, value, f in zip(raws, values, fields, strict=True):
        _emit_value(src, hints[f.name], raw, value, 1)
    build = _positional_or_none(cls) if all(f.init for f in fields) else None
    if build is None:
        arguments = ", ".join(f"{f.name}={v}" for f, v in zip(fields, values, strict=True))
        src.emit(1, f"return {src.refer(cls, 'cls')}({arguments})")
    else:
        src.emit(1, f"return {src.refer(build, 'build')}({', '.join(values)})")
    exec("\n".join(src.lines), src.names)
    decode = typing.cast(_Decode, src.names["decode"])
    _FAST_BY_CLASS[cls] = decode
    return decode


# -- the registry --------------------------------------------------------------------------------
# One line per stored event type. Names are forever: rename the class, never the string.

# VM creation batching (docs/ARCHITECTURE.md): the grouper stream ...
_register(MachineRequested, "vm.MachineRequested", 1)
_register(BatchSealed, "vm.BatchSealed", 1)
_register(BatchOutcomesRecorded, "vm.BatchOutcomesRecorded", 1)
# ... and one stream per batch.
_register(BatchOpened, "vm.BatchOpened", 1)
_register(BatchDispatched, "vm.BatchDispatched", 1)
_register(MachineCreated, "vm.MachineCreated", 1)
_register(MachineFailed, "vm.MachineFailed", 1)
_register(MachineNotFound, "vm.MachineNotFound", 1)
_register(MachineCreateAccepted, "vm.MachineCreateAccepted", 1)
_register(BatchCompleted, "vm.BatchCompleted", 1)
# Leader terms of the controllers sharing a database: one leadership stream.
_register(LeaderElected, "leadership.LeaderElected", 1)

# Batch jobs on slot testbeds (docs/ARCHITECTURE.md): a stream per testbed, job and scheduling.
_register(testbed.TestbedDefined, "testbed.TestbedDefined", 1)
_register(testbed.ClusterObserved, "testbed.ClusterObserved", 1)
_register(testbed.SlotReserved, "testbed.SlotReserved", 1)
_register(testbed.ReservationCleared, "testbed.ReservationCleared", 1)
_register(testbed.TestbedClaimed, "testbed.TestbedClaimed", 1)
_register(testbed.TestbedReleased, "testbed.TestbedReleased", 1)
_register(batch_job.JobDefined, "batch_job.JobDefined", 1)
_register(batch_job.JobClaimed, "batch_job.JobClaimed", 1)
_register(batch_job.ApplicationRequested, "batch_job.ApplicationRequested", 1)
_register(batch_job.JobScheduled, "batch_job.JobScheduled", 1)
_register(batch_job.JobRunning, "batch_job.JobRunning", 1)
_register(batch_job.JobCompleted, "batch_job.JobCompleted", 1)
_register(batch_job.JobFailed, "batch_job.JobFailed", 1)
_register(batch_job.JobReleased, "batch_job.JobReleased", 1)
_register(batch_job.ApplicationDeleted, "batch_job.ApplicationDeleted", 1)
_register(scheduling.SchedulingCreated, "scheduling.SchedulingCreated", 1)
_register(scheduling.ClaimsGranted, "scheduling.ClaimsGranted", 1)
_register(scheduling.ClaimConflicted, "scheduling.ClaimConflicted", 1)
_register(scheduling.HoldingsReleased, "scheduling.HoldingsReleased", 1)
_register(scheduling.JobsAssigned, "scheduling.JobsAssigned", 1)
_register(scheduling.SubmissionConfirmed, "scheduling.SubmissionConfirmed", 1)
_register(scheduling.SchedulingCompleted, "scheduling.SchedulingCompleted", 1)
_register(scheduling.QueueExtended, "scheduling.QueueExtended", 1)
_register(scheduling.SchedulingReleased, "scheduling.SchedulingReleased", 1)
# Node resource permits (docs/ARCHITECTURE.md): one stream per node.
_register(NodeJoined, "nodes.NodeJoined", 1)
_register(NodeCapacityChanged, "nodes.NodeCapacityChanged", 1)
_register(NodeLeft, "nodes.NodeLeft", 1)
_register(NodeConfigChanged, "nodes.NodeConfigChanged", 1)
_register(VmPodReserved, "nodes.VmPodReserved", 1)
_register(OtherPodReserved, "nodes.OtherPodReserved", 1)
_register(PodDeleted, "nodes.PodDeleted", 1)
_register(ResourcesGranted, "nodes.ResourcesGranted", 1)
_register(ComputeUnitViolated, "nodes.ComputeUnitViolated", 1)
_register(MigrationStarted, "nodes.MigrationStarted", 1)
_register(ControllerRestarted, "nodes.ControllerRestarted", 1)
_register(OtherPodsReserved, "nodes.OtherPodsReserved", 1)
_register(ComputeUnitMismatch, "nodes.ComputeUnitMismatch", 1)
_register(VmLimitsChanged, "nodes.VmLimitsChanged", 1)
_register(VmScalingChanged, "nodes.VmScalingChanged", 1)
_register(VmUseChanged, "nodes.VmUseChanged", 1)
_register(VmMigrationChanged, "nodes.VmMigrationChanged", 1)
# Pod-IP batch sizing (docs/ARCHITECTURE.md): one stream per subnet.
_register(ipam.SubnetCreated, "ipam.SubnetCreated", 1)
_register(ipam.NodeJoined, "ipam.NodeJoined", 1)
_register(ipam.NodeLeft, "ipam.NodeLeft", 1)
_register(ipam.DemandReported, "ipam.DemandReported", 1)
_register(ipam.ExhaustionChanged, "ipam.ExhaustionChanged", 1)
_register(ipam.BatchSizeChanged, "ipam.BatchSizeChanged", 1)
_register(ipam.PoolResized, "ipam.PoolResized", 1)
_register(ipam.IpsRequested, "ipam.IpsRequested", 1)
_register(ipam.IpsAllocated, "ipam.IpsAllocated", 1)
_register(ipam.IpsReleased, "ipam.IpsReleased", 1)
# Workloads acknowledged for placement (docs/ARCHITECTURE.md): one stream per workload.
_register(workloads.WorkloadSubmitted, "placement.WorkloadSubmitted", 1)
_register(workloads.WorkloadPlaced, "placement.WorkloadPlaced", 1)
_register(workloads.WorkloadWaiting, "placement.WorkloadWaiting", 1)
_register(workloads.WorkloadRejected, "placement.WorkloadRejected", 1)
_register(workloads.WorkloadReleased, "placement.WorkloadReleased", 1)
