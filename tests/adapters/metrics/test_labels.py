"""Bounded labels: closed sets, and caps that fold the rest into one series."""

from __future__ import annotations

from fleetledger.adapters.metrics.labels import OTHER, UNKNOWN, capped, known


class TestKnown:
    def test_a_known_value_is_kept(self) -> None:
        """A value of the set is its own label value."""
        assert known("idle", ("idle", "full")) == "idle"

    def test_anything_else_is_other(self) -> None:
        """An unknown string, or not a string at all, is ``other``."""
        assert [known("moon", ("idle",)), known(None, ("idle",)), known(3, ("3",))] == [UNKNOWN] * 3


class TestCapped:
    def test_under_the_cap_nothing_is_folded(self) -> None:
        """Every name keeps its series; no ``_other`` appears."""
        assert capped({"b": 1, "a": 2}, limit=2, merge=sum) == {"a": 2, "b": 1}

    def test_past_the_cap_the_rest_is_merged(self) -> None:
        """The first names by order keep their series; the rest are merged under ``_other``."""
        items = {f"n-{i:02}": i for i in range(10)}
        kept = capped(items, limit=3, merge=sum)
        assert kept == {"n-00": 0, "n-01": 1, "n-02": 2, OTHER: sum(range(3, 10))}

    def test_a_name_equal_to_other_is_folded_in(self) -> None:
        """A real name spelled ``_other`` cannot claim the folded series alone."""
        assert capped({OTHER: 5, "a": 1}, limit=5, merge=sum) == {"a": 1, OTHER: 5}
