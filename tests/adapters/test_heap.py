"""FrozenStartupHeap: what start-up allocated is left out of the collector's passes."""

from __future__ import annotations

import gc

from fleetledger.adapters.heap import FrozenStartupHeap


def test_start_freezes_the_heap_and_stop_releases_it() -> None:
    loaded = [{"node": n} for n in range(1000)]  # long-lived state a runtime loaded
    heap = FrozenStartupHeap()

    heap.start()
    try:
        frozen = gc.get_freeze_count()
        assert frozen >= len(loaded)
        assert all(o is not loaded[0] for o in gc.get_objects())
    finally:
        heap.stop()

    assert gc.get_freeze_count() == 0
