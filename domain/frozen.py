"""Building frozen slotted dataclasses on the hot paths of folding, without their ``__init__``.

A frozen dataclass's generated ``__init__`` writes each field through ``object.__setattr__`` (the
class's own ``__setattr__`` refuses), which costs several times what writing a slot does. A
replay folds every event of the log and each fold builds a handful of states (a node grant
builds a node, a pod and two of each of their resources), so those constructors were a large
share of a replay (``fleetledger bench replay``). :func:`positional` writes a constructor that
does what ``__init__`` does — every field, in order — by writing the slots directly; the object
it returns is the same frozen value, equal to one built by calling the class.

How the slots are written: where the class adds its slots directly to ``object``, the object is
made as an instance of a plain twin class with the very same slots, filled by ordinary attribute
stores (the interpreter's fastest write), and then given its real class — Python's ``__class__``
assignment, allowed exactly when both classes lay their instances out alike, which is checked
once here. The twin never leaves the constructor. Any other class gets the ``__set__`` of each
field's slot called instead, about twice as slow and still twice as fast as ``__init__``.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["positional"]

_T = TypeVar("_T")

_Field = dataclasses.Field[Any]
_Setter = Callable[[object, object], None]


def positional(cls: type[_T]) -> Callable[..., _T]:
    """A constructor of ``cls`` taking each ``__init__`` field positionally, in field order, that
    writes the slots instead of calling ``__init__`` (a field outside ``__init__`` gets its
    default, as there); ``TypeError`` for a class it cannot build so (its own ``__init__`` or a
    ``__post_init__``, a field without a slot, or outside ``__init__`` without a default)."""
    slots = _field_slots(cls)
    if slots is None or any(not f.init and f.default is dataclasses.MISSING for f, _ in slots):
        raise TypeError(f"{cls.__qualname__} is not a frozen slotted dataclass built by its fields")
    arguments = [f.name for f, _ in slots if f.init]
    values = [f.name if f.init else f"_default_{f.name}" for f, _ in slots]
    scope: dict[str, Any] = {"_cls": cls, "_new": object.__new__}
    scope.update({f"_default_{f.name}": f.default for f, _ in slots if not f.init})
    lines = [f"def build({', '.join(arguments)}):"]
    # Generated, as dataclasses writes __init__: one line per field.
    twin = _twin(cls)
    if twin is not None:
        scope["_twin"] = twin
        lines.append("    built = _new(_twin)")
        lines.extend(
            f"    built.{f.name} = {value}" for (f, _), value in zip(slots, values, strict=True)
        )
        lines.append("    built.__class__ = _cls")
    else:
        lines.append("    built = _new(_cls)")
        for (f, setter), value in zip(slots, values, strict=True):
            scope[f"_set_{f.name}"] = setter
            lines.append(f"    _set_{f.name}(built, {value})")
    lines.append("    return built")
    exec("\n".join(lines), scope)
    build: Callable[..., _T] = scope["build"]
    build.__qualname__ = f"positional({cls.__qualname__})"
    return build


def _field_slots(cls: type) -> list[tuple[_Field, _Setter]] | None:
    """Each field with its slot's ``__set__``, when ``cls`` is a dataclass whose ``__init__`` is
    the one dataclasses wrote, with no ``__post_init__`` and a slot per field; else ``None``."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return None
    init = cls.__dict__.get("__init__")
    if (
        init is None
        or getattr(getattr(init, "__code__", None), "co_filename", None) != "<string>"
        or hasattr(cls, "__post_init__")
    ):
        return None
    found: list[tuple[_Field, _Setter]] = []
    for f in dataclasses.fields(cls):
        slot = next((k.__dict__[f.name] for k in cls.__mro__ if f.name in k.__dict__), None)
        if not isinstance(slot, types.MemberDescriptorType):
            return None
        found.append((f, slot.__set__))
    return found


def _twin(cls: type) -> type | None:
    """A plain class laid out as ``cls`` (its slots added to ``object``), whose instances may be
    given ``cls`` as their class; ``None`` if ``cls`` is not one such."""
    slots = cls.__dict__.get("__slots__")
    if cls.__base__ is not object or not isinstance(slots, tuple):
        return None
    twin = type(f"{cls.__name__}Building", (), {"__slots__": slots, "__module__": __name__})
    probe: Any = object.__new__(twin)
    try:
        probe.__class__ = cls
    except TypeError:
        return None
    return twin
