"""events_of: a codec's events come from the domain's event union."""

from __future__ import annotations

import pytest

from fleetledger.adapters.runtime import events_of
from fleetledger.domain.machines import grouper


class TestEventsOf:
    def test_lists_the_members_of_the_union(self) -> None:
        """Every class of the union, in its order."""
        assert events_of(grouper.GrouperEvent) == (
            grouper.MachineRequested,
            grouper.BatchSealed,
            grouper.BatchOutcomesRecorded,
        )

    def test_a_single_class_is_its_own_union(self) -> None:
        """An aggregate with one event type needs no union."""
        assert events_of(grouper.BatchSealed) == (grouper.BatchSealed,)

    def test_refuses_what_is_not_event_classes(self) -> None:
        """Anything but classes (a name by mistake, say) is refused at once."""
        with pytest.raises(TypeError, match="not a union of event classes"):
            events_of("vm.BatchSealed")
