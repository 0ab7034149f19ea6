"""``serve --nodes-shard I/N`` and ``--ipam-shard I/N``: this process's node accounting, or its
subnets' allocator calls, lead partition ``I`` of ``N`` of their aggregates (nodes by name,
subnets by id) under a leadership of their own, while every other capability keeps the
process's main leadership (docs/SCALING.md, "Leadership per shard").

A shard has its own lease (the advisory lock of its name on Postgres, a lock file beside
SQLite, or a Kubernetes Lease named after it), its own term in
``leadership-<capability>/<I>-of-<N>`` and its own fence; its leadership campaigns in a thread
of its own, started and stopped by the capability's runtime. Only the leader's duties are
partitioned — for the nodes the take-over, cluster sync and migrations of the shard's nodes, and
the cluster writes they may make, self-fenced by the shard's lease; for the subnets the
allocator calls and their recorded answers — while reads and commands stay whole: any process
answers any agent and takes any node's report.

A partition is led only by the processes given it: run each one on two processes or more, or a
partition whose only process dies has no leader until it comes back.

Here: the option's text (:func:`shard_spec`, which the configuration model checks the
environment and the file with, so this module is imported whenever the parser is built and
imports nothing heavy at its top), the shard's leadership (:func:`lead_shard`), and its role and
term where ``serve`` reports them (:func:`leadership_router`, :class:`ShardRoles`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetledger.adapters.cli.options import MAX_COUNT

if TYPE_CHECKING:
    from fastapi import APIRouter
    from prometheus_client.metrics_core import Metric

    from fleetledger.adapters.clock import Clock
    from fleetledger.adapters.runtime import Leadership, Lease, Shard
    from fleetledger.eventstore import EventStore

__all__ = [
    "LEADERSHIP_PATH",
    "SHARDED_CAPABILITIES",
    "SHARD_FORMAT",
    "LedShard",
    "ShardRoles",
    "capability_shard",
    "check_interval",
    "lead_shard",
    "leadership_router",
    "shard_spec",
    "shard_status",
]

SHARD_FORMAT = "PARTITION/COUNT"
"""How a shard option (``--nodes-shard``, ``nodes.shard``, ``FLEETLEDGER_NODES_SHARD``, and
the same for ``ipam``) is written: ``0/2``."""

SHARDED_CAPABILITIES = ("nodes", "ipam")
"""The capabilities ``serve`` can lead a shard of (``--<capability>-shard``)."""

LEADERSHIP_PATH = "/v1/leadership"
"""Where ``serve`` lists this process's leaderships (:func:`leadership_router`)."""

# Seven digits reach MAX_COUNT; a longer number is refused as text rather than parsed.
_SPEC = re.compile(r"([0-9]{1,7})/([0-9]{1,7})")


def shard_spec(value: str) -> str:
    """The argparse type of a shard option: ``PARTITION/COUNT`` in its canonical form
    (``0/2``); ``ArgumentTypeError`` saying what to give otherwise (``x``, ``3/2``, ``0/0``)."""
    match = _SPEC.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise argparse.ArgumentTypeError(
            f"must be {SHARD_FORMAT}, like 0/2 (partition 0 of 2), not {value!r}"
        )
    partition, count = int(match[1]), int(match[2])
    if not 1 <= count <= MAX_COUNT:
        raise argparse.ArgumentTypeError(
            f"must be {SHARD_FORMAT} with a COUNT from 1 to {MAX_COUNT} (0/1 leads all of "
            f"them), not {value!r}"
        )
    if partition >= count:
        raise argparse.ArgumentTypeError(
            f"must be {SHARD_FORMAT} with a PARTITION below COUNT (0 to {count - 1} of "
            f"{count}), not {value!r}"
        )
    return f"{partition}/{count}"


def capability_shard(capability: str, spec: str) -> Shard:
    """The shard of ``capability`` (one of :data:`SHARDED_CAPABILITIES`) that ``spec`` names;
    ``ValueError`` naming the option for a spec :func:`shard_spec` refuses."""
    from fleetledger.adapters.runtime import Shard

    if capability not in SHARDED_CAPABILITIES:
        raise ValueError(
            f"serve leads shards of {', '.join(SHARDED_CAPABILITIES)} only, not {capability!r}"
        )
    try:
        partition, count = shard_spec(spec).split("/")
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"--{capability}-shard {e}") from e
    return Shard(capability, int(partition), int(count))


def check_interval(lease_seconds: float) -> float:
    """How often a leadership of ``serve`` renews a lease of ``lease_seconds``: five times in
    it, and no more often than five times a second."""
    return max(0.2, lease_seconds / 5)


@dataclass(frozen=True, slots=True)
class LedShard:
    """A shard this process campaigns for, and the leadership of its own it does so with."""

    shard: Shard
    leadership: Leadership


def lead_shard(
    store: EventStore,
    lease: Lease,
    shard: Shard,
    *,
    clock: Clock,
    holder: str,
    lease_seconds: float,
) -> LedShard:
    """The leadership of ``shard`` on ``lease`` (the shard's own: ``build_lease`` given the
    shard), renewed and self-fenced as the process's main leadership is."""
    from fleetledger.adapters.runtime import Leadership

    leadership = Leadership(
        store,
        lease,
        clock=clock,
        holder=holder,
        shard=shard,
        check_interval=check_interval(lease_seconds),
        lease_seconds=lease_seconds,
    )
    return LedShard(shard, leadership)


def shard_status(led: LedShard) -> dict[str, Any]:
    """One shard as ``GET /v1/leadership`` lists it."""
    shard, leadership = led.shard, led.leadership
    return {
        "name": shard.name,
        "capability": shard.capability,
        "partition": shard.partition,
        "count": shard.count,
        "role": leadership.role,
        "term": leadership.term(),
    }


def leadership_router(main: Leadership | None, shards: Sequence[LedShard]) -> APIRouter:
    """``GET /v1/leadership``: this process's leaderships, ``{holder, role, term, shards:
    [{name, capability, partition, count, role, term}]}`` — its role and term under the main
    leadership (``main``; ``None``: it leads alone) and in each shard it campaigns for."""
    from fastapi import APIRouter

    router = APIRouter()

    @router.get(LEADERSHIP_PATH)
    def leadership() -> dict[str, Any]:
        """This process's role and term under its main leadership and in each of its shards."""
        return {
            "holder": None if main is None else main.holder,
            "role": "leader" if main is None else main.role,
            "term": None if main is None else main.term(),
            "shards": [shard_status(led) for led in shards],
        }

    return router


class ShardRoles:
    """The Prometheus collector of this process's shards:
    ``fleetledger_shard_role{shard,role}`` (1 for its role in the shard, 0 for the others, as
    ``fleetledger_leader_role`` is for the main leadership) and
    ``fleetledger_shard_held_term{shard}`` (absent while it follows the shard)."""

    def __init__(self, shards: Sequence[LedShard]) -> None:
        self._shards = tuple(shards)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        from fleetledger.adapters.metrics.live import ROLES

        roles = GaugeMetricFamily(
            "fleetledger_shard_role",
            "1 for this process's leadership role in each shard it campaigns for, 0 for the "
            "others.",
            labels=["shard", "role"],
        )
        terms = GaugeMetricFamily(
            "fleetledger_shard_held_term",
            "The term this process leads each shard in (absent while it follows).",
            labels=["shard"],
        )
        for led in self._shards:
            name, leadership = led.shard.name, led.leadership
            current = leadership.role.replace(" ", "_")
            for role in ROLES:
                roles.add_metric([name, role], 1.0 if role == current else 0.0)
            term = leadership.term()
            if term is not None:
                terms.add_metric([name], term)
        yield roles
        yield terms
