"""Shards: a capability's aggregates split into partitions, each led on its own.

A **shard** is named ``<capability>/<partition>-of-<count>`` (``nodes/3-of-8``) when it is a
partition of a capability's aggregates, or by any other valid name (``machines/grouper-a``, one
grouper). The count is part of the name: partition 0 of 2 and partition 2 of 4 own overlapping
nodes, so they must never be one lease, one term and one fence. A new count is a new set of
shards, taken over by draining the old one (docs/SCALING.md). Each
shard has its own lease, its own term in ``leadership-<shard>`` and its own fence in the store
(docs/SCALING.md, "Leadership per shard"). Here: the names, which aggregates a partition owns,
and the lock key of a shard's lease on Postgres.

Both hashes are stored contracts: the partition of every aggregate and the lock every process
takes follow from them, so processes of different versions, or of different Python runs (whose
``hash()`` of a string differs), must agree on them. Never change them.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Final, Protocol

__all__ = [
    "MAX_SHARD_NAME_LENGTH",
    "Shard",
    "check_runtime_shard",
    "partition_of",
    "shard_lock_key",
    "shard_name",
]

MAX_SHARD_NAME_LENGTH: Final = 200
"""The longest shard name the store fences (it keeps one term per name)."""

_NAME = re.compile(r"[A-Za-z0-9._/-]+")
_CAPABILITY = re.compile(r"[A-Za-z0-9._-]+")
# Personalised hashes: the same name never gives related partition and lock values.
_PARTITION_PERSON: Final = b"fl-partition"
_LOCK_PERSON: Final = b"fl-shard-lease"


def shard_name(shard: Shard | str) -> str:
    """The name of ``shard``, checked: ``ValueError`` unless it is 1 to 200 characters of
    ``A-Z a-z 0-9 . _ / -`` (what the store accepts as a shard)."""
    name = shard.name if isinstance(shard, Shard) else shard
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"a shard name is letters, digits and . _ / - (like 'nodes/3-of-8'), got {name!r}"
        )
    if len(name) > MAX_SHARD_NAME_LENGTH:
        raise ValueError(
            f"a shard name is at most {MAX_SHARD_NAME_LENGTH} characters, "
            f"got {len(name)}: {name[:40]!r}…"
        )
    return name


def partition_of(name: str, count: int) -> int:
    """The partition (``0`` to ``count - 1``) of the aggregate named ``name`` (a node's name,
    not its stream id): a BLAKE2b hash of the name, modulo ``count``. The same in every process
    and every run."""
    _check_count(count)
    return _partition(name, count)


# Cached: a leader's pass asks for every aggregate's partition, every pass, and the hash costs
# several times the lookup.
@functools.lru_cache(maxsize=1 << 16)
def _partition(name: str, count: int) -> int:
    digest = hashlib.blake2b(name.encode(), digest_size=8, person=_PARTITION_PERSON).digest()
    return int.from_bytes(digest, "big") % count


def shard_lock_key(shard: Shard | str) -> int:
    """The Postgres advisory-lock key of ``shard``'s lease: a 63-bit hash of its name, negative.

    The fixed keys (the migration lock 4_242_000, the single leader's 4_242_001) are positive,
    so no shard's lease can be one of them; two shards share a key only by a 63-bit collision."""
    digest = hashlib.blake2b(shard_name(shard).encode(), digest_size=8, person=_LOCK_PERSON)
    return -1 - (int.from_bytes(digest.digest(), "big") >> 1)


@dataclass(frozen=True, slots=True)
class Shard:
    """Partition ``partition`` of ``count`` of ``capability``'s aggregates: ``nodes/3-of-8``."""

    capability: str
    partition: int
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.capability, str) or not _CAPABILITY.fullmatch(self.capability):
            raise ValueError(
                "a shard's capability is letters, digits and . _ - (no '/': the name is "
                f"<capability>/<partition>-of-<count>), got {self.capability!r}"
            )
        _check_count(self.count)
        partition = self.partition
        if type(partition) is not int or not 0 <= partition < self.count:
            raise ValueError(
                f"a shard's partition is from 0 to {self.count - 1} (its count less one), "
                f"got {partition!r}"
            )
        shard_name(self.name)

    @property
    def name(self) -> str:
        """``<capability>/<partition>-of-<count>``: its leadership stream is
        ``leadership-<name>``."""
        return f"{self.capability}/{self.partition}-of-{self.count}"

    def owns(self, name: str) -> bool:
        """Whether the aggregate named ``name`` is in this partition."""
        return partition_of(name, self.count) == self.partition


class _Led(Protocol):
    @property
    def shard(self) -> str | None: ...


def check_runtime_shard(
    shard: Shard | None,
    leadership: _Led | None,
    *,
    capability: str,
    runtime: str,
    aggregate: str,
) -> None:
    """Refuse a ``runtime`` (its class name) of ``capability`` given a shard of another
    capability, or paired with a leadership of another shard (or of none while it has one):
    ``ValueError`` saying what to give. A runtime of a shard is led by that shard's leadership,
    and a shard's leadership leads only that shard's aggregates: any other pairing would let two
    leaders act on one aggregate."""
    if shard is not None and shard.capability != capability:
        raise ValueError(
            f"{runtime} leads a shard of the {aggregate}s (like '{capability}/0-of-2'), "
            f"got {shard.name!r}"
        )
    if leadership is None:
        return
    led = leadership.shard
    if led != (None if shard is None else shard.name):
        raise ValueError(
            f"the leadership leads {f'shard {led!r}' if led else f'every {aggregate}'} but the "
            f"runtime was given {f'shard {shard.name!r}' if shard else 'no shard'}: give both "
            f"the same shard (a Leadership(shard=...) and {runtime}(shard=...)), or neither"
        )


def _check_count(count: int) -> None:
    if type(count) is not int or count < 1:
        raise ValueError(f"a partition count is a whole number of at least 1, got {count!r}")
