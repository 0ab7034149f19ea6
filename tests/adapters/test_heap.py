"""FrozenStartupHeap: what start-up allocated is left out of the collector's passes."""

from __future__ import annotations

import gc

from fleetledger.adapters.heap import FrozenStartupHeap


def test_start_freezes_the_heap_and_stop_releases_it() -> None:
    loaded = [{"node": n} for n in range(1000)]  # long-lived state a runtime loaded
    heap = FrozenStartupHeap()

    heap.start()
    try:
        assert gc.get_freeze_count() >= len(loaded)
        assert all(o is not loaded[0] for o in gc.get_objects())
    finally:
        heap.stop()

    assert gc.get_freeze_count() == 0


def test_young_and_full_passes_are_rarer_while_started_and_as_before_after() -> None:
    before = gc.get_threshold()
    heap = FrozenStartupHeap()

    heap.start()
    try:
        young, middle, full = gc.get_threshold()
        # Rarer than CPython's 700 young, 10 full; young passes stay small enough that a gen-1
        # pass (what ``middle`` young passes kept) is short, and full passes come after as
        # many allocations as before.
        assert 700 < young <= 2_000 and full >= 500
        assert young * middle * full >= 10_000 * 10 * 100
    finally:
        heap.stop()

    assert gc.get_threshold() == before
