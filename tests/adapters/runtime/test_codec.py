"""events_of: a codec's events come from the domain's event union; encode's fencing metadata."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleetledger.adapters.runtime import LEADER_SHARD_KEY, LEADER_TERM_KEY, events_of
from fleetledger.adapters.runtime.leadership import LEADERSHIP_CODEC
from fleetledger.domain.leadership import LeaderElected
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


class TestFencingMetadata:
    def _encoded(self, **fencing: object) -> list[dict[str, object]]:
        at = datetime(2025, 1, 1, tzinfo=UTC)
        events = [LeaderElected(1, "a", at), LeaderElected(2, "b", at)]
        records = LEADERSHIP_CODEC.encode(
            "leadership-x",
            1,
            events,
            causation_ids=["c", "c"],
            actor="t",
            **fencing,  # type: ignore[arg-type]
        )
        return [dict(record.metadata) for record in records]

    def test_the_shard_goes_only_beside_a_term(self) -> None:
        """An event with a term names the shard; one without carries neither (the store
        refuses a shard alone)."""
        first, second = self._encoded(leader_terms=[3, None], leader_shard="nodes/0-of-2")
        assert (first[LEADER_TERM_KEY], first[LEADER_SHARD_KEY]) == (3, "nodes/0-of-2")
        assert LEADER_TERM_KEY not in second and LEADER_SHARD_KEY not in second

    def test_without_a_shard_the_metadata_is_as_before(self) -> None:
        """An unsharded leader's events carry the term alone, exactly as they always have."""
        assert self._encoded(leader_terms=[3, 3], leader_shard=None) == self._encoded(
            leader_terms=[3, 3]
        )
        assert LEADER_SHARD_KEY not in self._encoded(leader_terms=[3, 3])[0]
