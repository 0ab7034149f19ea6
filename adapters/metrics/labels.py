"""Bounded label values: what a label may carry, and how many series a family may have.

A label value is either one of a known, short set (seal reasons, error codes, outcomes: anything
else becomes ``other``) or a name an operator configured or the cluster has (a node, a subnet, a
testbed, a pool), capped: past the cap the rest are folded into one series labelled
:data:`OTHER`. Request ids, pod names, batch ids and workload ids never become label values.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TypeVar

__all__ = [
    "MAX_NODE_SERIES",
    "MAX_POOL_SERIES",
    "MAX_SUBNET_SERIES",
    "MAX_TESTBED_SERIES",
    "OTHER",
    "UNKNOWN",
    "capped",
    "known",
]

OTHER = "_other"
"""The series every name past a family's cap is folded into. Node, testbed and pool names are
DNS names, which cannot start with ``_``; a subnet id could, and is then folded in as well."""
UNKNOWN = "other"
"""The value of a closed-set label that met a value outside its set (an older or newer log)."""

MAX_NODE_SERIES = 100
"""Nodes with series of their own (the first by name); the rest are summed into :data:`OTHER`."""
MAX_SUBNET_SERIES = 50
"""Subnets with series of their own (the first by id)."""
MAX_TESTBED_SERIES = 50
"""Testbeds with series of their own (the first by name)."""
MAX_POOL_SERIES = 20
"""Worker pools with series of their own (the first seen)."""

T = TypeVar("T")


def known(value: object, allowed: Collection[str]) -> str:
    """``value`` if it is one of ``allowed``, else :data:`UNKNOWN`."""
    return value if isinstance(value, str) and value in allowed else UNKNOWN


def capped(
    items: Mapping[str, T], *, limit: int, merge: Callable[[Iterable[T]], T]
) -> dict[str, T]:
    """The first ``limit`` items by name, and the rest merged into one under :data:`OTHER`
    (absent when nothing is past the cap). Sorting by name keeps each name on the same series
    from scrape to scrape while the set changes little."""
    names = sorted(items)
    kept = {name: items[name] for name in names[:limit] if name != OTHER}
    rest = [items[name] for name in names if name not in kept]
    if rest:
        kept[OTHER] = merge(rest)
    return kept
