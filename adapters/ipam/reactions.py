"""The allocator's side of the subnets: calls made from the log, their answers recorded in it.

A subnet's decisions ask for side effects (:class:`~fleetledger.domain.ipam.IpsRequested`: call
the allocator; :class:`~fleetledger.domain.ipam.PoolResized` with IPs pending release: give them
back; :class:`~fleetledger.domain.ipam.NodeLeft`: return a gone node's IPs). A checkpointed
:class:`~fleetledger.adapters.runtime.reactors.Reactor` hears of them on the leader and hands the
work to a :class:`~fleetledger.adapters.runtime.TaskRunner`: the subscription's handler runs inside
the transaction that moves its checkpoint, and appending from there would wait on that very
transaction.

The log, not the reactor, holds the outcome of each call, so the work is *settling a subnet*:
catch its stream up, then make every call its state still lists — each unanswered request
(:func:`~fleetledger.domain.ipam.outstanding_requests`) and each node's pending release
(:func:`~fleetledger.domain.ipam.pending_releases`) — and record the answers. Settling twice does
nothing the first did not: a recorded answer is no longer outstanding, and the allocator answers a
request it already answered with the same IPs. That makes crash recovery the same code:
:meth:`SubnetReactions.resume` settles every subnet when this process starts leading, covering a
call whose answer was never recorded. A settle already queued for a subnet is not queued again.

A gone node's IPs are returned once :class:`~fleetledger.domain.ipam.NodeLeft` is heard, skipping
those the subnet has handed to a node since; an answer the subnet refuses (its node left while
the call was in flight) goes back too.

An allocator that answers short (fewer free IPs than the subnet counts: IPs taken outside it)
would be asked again at once, for ever, since the subnet re-requests the remainder with every
answer. So after a short answer the subnet's requests wait until this runtime gives IPs back to
the allocator (a release, a gone node's IPs) or the next :meth:`~SubnetReactions.resume`.

Known gaps, both needing a crash in a narrow window: IPs of a gone node whose return was queued
but not made, and an answer made but not recorded for a node that then left before the restart,
stay with the allocator — the subnet's state no longer names them, so
:meth:`~SubnetReactions.resume` cannot find them. Closing them needs the allocator to list what
it holds, for a reconciliation against the log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from fleetledger.adapters.runtime import TaskRunner
from fleetledger.adapters.runtime.reactors import Reactor
from fleetledger.domain import ipam
from fleetledger.domain.ipam import IpsRequested, NodeLeft, PoolResized, SubnetEvent
from fleetledger.eventstore import RecordedEvent

from .aggregate import SUBNET_CODEC, subnet_id_of
from .allocator import IpAllocator
from .errors import CommandRejected, InvalidIpamCommand, IpamError, NotLeader
from .service import Outcome, SubnetService

__all__ = ["SubnetReactions"]

log = structlog.get_logger(__name__)


class SubnetReactions:
    """Makes the allocator calls the subnets ask for and records their answers; thread-safe."""

    def __init__(
        self,
        service: SubnetService,
        allocator: IpAllocator,
        *,
        runner: TaskRunner,
        name: str = "ipam-allocator",
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        """``owns``: whether a subnet (by id) is this process's to settle — its shard's
        partition; ``None``: every subnet."""
        self._service = service
        self._allocator = allocator
        self._runner = runner
        self._owns: Callable[[str], bool] = owns if owns is not None else _every_subnet
        self._lock = threading.Lock()
        self._queued: set[str] = set()
        self._short: set[str] = set()
        self.reactor: Reactor[SubnetEvent] = Reactor(
            name=name,
            codec=SUBNET_CODEC,
            types=(IpsRequested, PoolResized, NodeLeft),
            streams=self._owned_stream,
            react=self._heard,
        )

    def _owned_stream(self, stream_id: str) -> bool:
        subnet = subnet_id_of(stream_id)
        return subnet is not None and self._owns(subnet)

    # -- from the log --------------------------------------------------------------------------

    def _heard(self, event: SubnetEvent, record: RecordedEvent) -> None:
        if isinstance(event, NodeLeft):
            if event.released:
                self._runner.submit(
                    lambda: self._return(event.subnet_id, event.node, event.released)
                )
            return
        if isinstance(event, PoolResized) and not event.pending_release:
            return
        self.request_settle(event.subnet_id)

    def request_settle(self, subnet_id: str) -> None:
        """Settle ``subnet_id`` soon, unless a settle of it is already waiting to run."""
        with self._lock:
            if subnet_id in self._queued:
                return
            self._queued.add(subnet_id)
        self._runner.submit(lambda: self._settle_queued(subnet_id))

    def resume(self) -> None:
        """Settle every subnet this process settles: the calls an earlier leader may not have
        finished."""
        with self._lock:
            self._short.clear()
        try:
            subnets = self._service.subnet_ids()
        except IpamError as e:
            log.warning("could not list subnets to resume their allocator calls", error=str(e))
            return
        for subnet_id in subnets:
            if self._owns(subnet_id):
                self.request_settle(subnet_id)

    # -- the work ------------------------------------------------------------------------------

    def _settle_queued(self, subnet_id: str) -> None:
        with self._lock:
            # Anything logged from now on queues a new settle: this one reads the state after.
            self._queued.discard(subnet_id)
        try:
            self.settle(subnet_id)
        except NotLeader as e:
            log.info(
                "stopped settling a subnet: no longer the leader", subnet=subnet_id, error=str(e)
            )
        except IpamError as e:
            log.warning(
                "could not settle a subnet; it is settled again on its next change or restart",
                subnet=subnet_id,
                error=str(e),
            )
        except Exception:
            # A runner's task logs its own failures; nobody else would see them.
            log.exception("settling a subnet failed", subnet=subnet_id)

    def settle(self, subnet_id: str) -> int:
        """Make every allocator call ``subnet_id``'s state still lists and record the answers;
        returns how many calls were made.

        The answers of a pass are recorded together, in few commits (a pass over a subnet's
        nodes used to cost a commit per node), each as its own command: one the subnet refuses
        leaves the others recorded. A call whose answer a crash left unrecorded is made again by
        the next settle, and the allocator answers it as before (see the module docstring).
        """
        calls = 0
        # Releases first: the IPs they free can serve the requests below.
        released: list[tuple[str, tuple[str, ...]]] = []
        try:
            for node, ips in ipam.pending_releases(self._service.load(subnet_id)).items():
                self._allocator.release(subnet_id, node, ips)
                calls += 1
                self._refilled(subnet_id)
                released.append((node, ips))
        finally:
            # What the allocator did before a failure is recorded all the same.
            self._record_releases(subnet_id, released)
        answers: list[tuple[str, int, tuple[str, ...]]] = []
        try:
            for node, request, count in ipam.outstanding_requests(self._service.load(subnet_id)):
                with self._lock:
                    if subnet_id in self._short:
                        break
                ips = self._allocator.allocate(subnet_id, node, request=request, count=count)
                calls += 1
                if len(ips) < count:
                    # The subnet asks the remainder again at once; an allocator with fewer free
                    # IPs than the subnet counts (IPs taken outside it) would answer short for
                    # ever, so its requests wait until IPs go back to it.
                    log.warning(
                        "the allocator answered short; waiting for IPs to come back to it",
                        subnet=subnet_id,
                        node=node,
                        asked=count,
                        answered=len(ips),
                    )
                    with self._lock:
                        self._short.add(subnet_id)
                answers.append((node, request, ips))
        finally:
            self._record_allocations(subnet_id, answers)
        return calls

    def _refilled(self, subnet_id: str) -> None:
        with self._lock:
            waiting = subnet_id in self._short
            self._short.discard(subnet_id)
        if waiting:
            self.request_settle(subnet_id)

    def _record_allocations(
        self, subnet_id: str, answers: list[tuple[str, int, tuple[str, ...]]]
    ) -> None:
        if not answers:
            return
        outcomes = self._service.record_allocations(subnet_id, answers)
        refused = [
            (answer, outcome)
            for answer, outcome in zip(answers, outcomes, strict=True)
            if isinstance(outcome, CommandRejected | InvalidIpamCommand)
        ]
        if refused:
            # The subnet will not take these answers (the node left meanwhile, or the allocator
            # answered out of bounds): every IP of them the subnet does not count as held goes
            # back, or the allocator would hold it for ever.
            owners = self._service.load(subnet_id).owners
            for (node, request, ips), error in refused:
                stray = tuple(ip for ip in ips if ip not in owners)
                log.warning(
                    "the subnet refused an allocator answer; returning its IPs",
                    subnet=subnet_id,
                    node=node,
                    request=request,
                    returned=len(stray),
                    reason=str(error),
                )
                if stray:
                    self._allocator.release(subnet_id, node, stray)
                    self._refilled(subnet_id)
        _raise_first_failure(outcomes)

    def _record_releases(self, subnet_id: str, releases: list[tuple[str, tuple[str, ...]]]) -> None:
        if not releases:
            return
        outcomes = self._service.record_releases(subnet_id, releases)
        for (node, _), outcome in zip(releases, outcomes, strict=True):
            if isinstance(outcome, CommandRejected | InvalidIpamCommand):
                log.warning(
                    "the subnet refused a release the allocator made",
                    subnet=subnet_id,
                    node=node,
                    reason=str(outcome),
                )
        _raise_first_failure(outcomes)

    def _return(self, subnet_id: str, node: str, released: tuple[str, ...]) -> None:
        try:
            owners = self._service.load(subnet_id).owners
            # An IP handed to another node since the node left is that node's now.
            gone = tuple(ip for ip in released if ip not in owners)
            if gone:
                self._allocator.release(subnet_id, node, gone)
                self._refilled(subnet_id)
        except IpamError as e:
            log.warning(
                "could not return a gone node's IPs to the allocator",
                subnet=subnet_id,
                node=node,
                error=str(e),
            )
        except Exception:
            log.exception("returning a gone node's IPs failed", subnet=subnet_id, node=node)


def _every_subnet(_subnet_id: str) -> bool:
    return True


def _raise_first_failure(outcomes: list[Outcome]) -> None:
    """Raise what stopped a recording (the log unreachable, a newer leader), as the call of
    one recording raised it; refusals are handled by the caller."""
    for outcome in outcomes:
        if isinstance(outcome, IpamError) and not isinstance(
            outcome, CommandRejected | InvalidIpamCommand
        ):
            raise outcome
