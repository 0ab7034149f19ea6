"""Positional constructors of frozen slotted dataclasses: the same values ``__init__`` builds,
of the same class, still frozen."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Mapping

import pytest

from fleetledger.domain.frozen import positional
from fleetledger.domain.ipam import SubnetState
from fleetledger.domain.nodes import NodeState, PodResource, ResourceState


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 0
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Derived(Point):
    z: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    x: int

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("negative")


@dataclasses.dataclass(frozen=True)
class Unslotted:
    x: int


class TestPositional:
    @pytest.mark.parametrize(
        ("cls", "values"),
        [
            (Point, (1, 2, {"a": "b"})),
            (Derived, (1, 2, {}, 3)),
            (ResourceState, (32000, 1000, 0.85, 500, 100, 0, 0)),
            (PodResource, (250, 500, 1000, 500, 0, 0)),
            (
                NodeState,
                ("n", True, None, ResourceState(), ResourceState(), 1, 0, {}, {}, 0, 0, 3),
            ),
        ],
        ids=lambda value: getattr(value, "__name__", ""),
    )
    def test_builds_what_the_class_builds(self, cls: type, values: tuple[object, ...]) -> None:
        """The object equals the one ``__init__`` builds from the same values, hashes alike, is
        of the class itself, and copies and pickles as one."""
        built: object = positional(cls)(*values)
        called: object = cls(*values)
        assert type(built) is cls
        assert built == called
        assert repr(built) == repr(called)
        assert copy.copy(built) == called
        assert pickle.loads(pickle.dumps(built)) == called
        if all(isinstance(value, int | float | str | bool | type(None)) for value in values):
            assert hash(built) == hash(called)

    def test_the_object_stays_frozen(self) -> None:
        """Nothing may set a field of an object built positionally."""
        point = positional(Point)(1, 2, {})
        with pytest.raises(dataclasses.FrozenInstanceError):
            point.x = 5  # type: ignore[misc]

    def test_a_field_outside_init_gets_its_default(self) -> None:
        """A subnet's index is no argument, and starts empty as ``__init__`` leaves it."""
        subnet = positional(SubnetState)("s", 16, {}, {}, 1, False)
        assert subnet == SubnetState("s", 16)
        assert subnet._index is None

    def test_every_argument_is_required(self) -> None:
        """Defaults are not filled in: the constructor takes every field, in order."""
        with pytest.raises(TypeError):
            positional(Point)(1)

    @pytest.mark.parametrize("cls", [Checked, Unslotted, int])
    def test_a_class_it_cannot_build_is_refused(self, cls: type) -> None:
        """A class whose ``__init__`` does more than set its fields (a ``__post_init__``), or
        that has no slots (or is no dataclass) has no positional constructor."""
        with pytest.raises(TypeError, match="frozen slotted dataclass"):
            positional(cls)
