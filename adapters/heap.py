"""Keeping the start-up heap out of the garbage collector's full passes.

A controller loads its streams, read models and libraries once at start-up, and those objects
live as long as the process. Under load every decision replaces a few long-lived objects (a
node's state, its pods), which fills the oldest generation quickly enough to trigger a full
collection about once a second, and a full collection scans the whole heap: measured at
80-120 ms on ``bench nodes`` (100 nodes, 2,000 pods, ~2,400 requests/s), a pause every agent in
flight waited out, which set the p99. Frozen once the runtimes have started (``gc.freeze``),
those objects are no longer scanned; what the collector still scans is what was allocated since,
and full passes over that come ten times less often. On the same bench: 2,400 requests/s with a
p99 of 46-48 ms frozen, 3,150-3,450 with p99 37-43 ms with the rarer full passes too. Young
passes are made rarer as well (see ``start``).
"""

from __future__ import annotations

import gc

__all__ = ["FrozenStartupHeap"]

_FULL_PASS_EVERY = 500
"""Gen-1 passes between full passes (CPython's default is 10): with the young passes below,
a full pass comes after as many allocations as 100 did with young passes of 10,000."""
_YOUNG_PASS_EVERY = 2_000
"""Net container allocations between young passes (CPython's default is 700)."""


class FrozenStartupHeap:
    """A lifecycle member, started after the runtimes: freezes what start-up allocated."""

    __slots__ = ("_thresholds",)

    def __init__(self) -> None:
        self._thresholds = gc.get_threshold()

    def start(self) -> None:
        gc.collect()
        gc.freeze()
        # A full pass still comes whenever objects promoted since the freeze outnumber a quarter
        # of what the last one kept, which the states each decision replaces do about once a
        # second, at 10-30 ms a pass. Ten times fewer gen-1 passes between full ones keep those
        # pauses rare; cyclic garbage still goes at the next full pass.
        # Young passes too: a request in flight lives a few milliseconds, and under load a
        # pass every 700 allocations scans (and promotes) thousands of such objects that would
        # have been freed a moment later. Not too rare, though: a gen-1 pass scans what ten
        # young passes kept, and at 10,000 allocations a pass that was 22-64 ms every few
        # seconds under `bench serve --driver wrk` (every request in flight waits it out: it
        # set the p99); at 2,000, at most 12-19 ms, for about 1 % more CPU in collections.
        young, middle, old = gc.get_threshold()
        self._thresholds = (young, middle, old)
        gc.set_threshold(max(young, _YOUNG_PASS_EVERY), middle, max(old, _FULL_PASS_EVERY))

    def stop(self) -> None:
        gc.set_threshold(*self._thresholds)
        gc.unfreeze()
