"""A testbed of slots on labelled nodes, one stream per testbed (``testbed-<name>``).

A testbed puts ``slots_per_node`` slots of one resource size on every node that carries its node
label (seed 05, "Slot Operator"). Each slot is held by a *ghost pod* that requests the slot's
resources, so the capacity stays reserved while no job uses it; a job's pod takes a slot by
preempting its ghost pod (see :mod:`fleetledger.domain.testbeds.extender`).

Slot ids number the slots round-robin across nodes: sort by position on node, then by node, so
consecutive ids spread over the nodes. Two nodes of two slots give ``0 → (n1, 0)``,
``1 → (n2, 0)``, ``2 → (n1, 1)``, ``3 → (n2, 1)``. Nodes are ordered by the value of the testbed's
label, which the original parses as the node's number: values that are whole numbers compare as
numbers (node ``2`` before node ``10``); values that are not come after every numeric one, in
string order; equal values fall back to the node's name.

Slot states (:func:`slots`)::

    creating   its ghost pod is not observed yet (the reconciler creates it)
    free       one ghost pod holds it and no pod has reserved it
    reserved   a named pod reserved it (the extender's choice) and is not bound yet
    occupied   the reserving pod runs on the slot's node
    error      conflicting pods (two ghost pods, or the reserving pod bound to another node), or
               its node has no room for the testbed's slots

``creating`` is not one of the original's states: a slot whose ghost pod is missing is neither free
(nothing holds its resources) nor in error (the reconciler is about to create it).

What the cluster looks like is a fact recorded with :class:`ClusterObserved`; the reconciler's work
is then the pure diff :func:`reconcile` of desired against observed ghost pods. Reservations are
events (:class:`SlotReserved`) appended with the stream's expected version, so two pods can never
reserve one slot. A scheduling holds the whole testbed while it runs (:class:`TestbedClaimed`).

**Ghost pod names.** A ghost pod's name says where it stands and its size (:func:`ghost_pod_name`),
plus a per-slot *generation*: a ghost observed failed or evicted (``ObservedPod.failed``) under the
slot's current name moves that slot to the next generation, so its replacement gets a fresh name
that never collides with the failed pod object (which may linger). The generation is folded from
the recorded observations only, so a pass repeated after a crash computes the same name and never
creates a second ghost.

**Problems.** What needs an operator — a node without room for its slots (its ghosts are deleted
and none created there), a slot in error — is decided with every :class:`ObserveCluster` and
recorded on the testbed when it changes (:class:`ProblemsReported`, ``TestbedState.problems``).

**Deletion.** :class:`DeleteTestbed` is refused while a scheduling holds the testbed. A deleted
testbed has no slots (the extender finds none), its reconciliation deletes every ghost pod, and it
refuses every command but :class:`DefineTestbed`, which re-creates it, and :class:`ObserveCluster`,
so the log keeps showing the ghosts go.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal, TypeAlias

from fleetledger.domain.errors import InvalidCommand, Rejected

__all__ = [
    "ClaimTestbed",
    "ClusterObserved",
    "DefineTestbed",
    "DeleteTestbed",
    "GhostPod",
    "ObserveCluster",
    "ObservedNode",
    "ObservedPod",
    "OverallState",
    "ProblemsReported",
    "ReconcilePlan",
    "ReleaseTestbed",
    "ReservationCleared",
    "ReserveSlot",
    "SEED_SLOT_IDS_LABEL",
    "SEED_TESTBED_LABEL",
    "SLOT_IDS_ANNOTATION",
    "Slot",
    "SlotReserved",
    "SlotStatus",
    "TESTBED_ANNOTATION",
    "TestbedClaimed",
    "TestbedCommand",
    "TestbedDefined",
    "TestbedDeleted",
    "TestbedEvent",
    "TestbedReleased",
    "TestbedState",
    "decide",
    "evolve",
    "free_slot_ids",
    "ghost_generation",
    "ghost_pod_name",
    "initial_state",
    "nodes_of",
    "overall_state",
    "reconcile",
    "reservation_of",
    "slots",
    "stream_name",
    "usable_slot_ids",
]

SlotStatus = Literal["creating", "free", "reserved", "occupied", "error"]
OverallState = Literal["running", "success", "in_progress", "error"]

# The annotations a job's pods carry so the extender can place them (seed 05, "Slot IDs"): the
# testbed's name and the comma-separated slot ids of the whole application.
TESTBED_ANNOTATION = "fleetledger.io/testbed"
SLOT_IDS_ANNOTATION = "fleetledger.io/slot-ids"
# The original operator's pod labels for the same (its testbed is a "Slots" resource; a label
# value cannot hold commas, so its slot ids are joined by "_"): pods written for it work as well.
SEED_TESTBED_LABEL = "batchjob.tuberlin.de/slots-resource-name"
SEED_SLOT_IDS_LABEL = "batchjob.tuberlin.de/slots-ids"


def stream_name(testbed: str) -> str:
    """The testbed's stream."""
    return f"testbed-{testbed}"


# -- observations --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObservedNode:
    """A node carrying the testbed's label; ``label_value`` orders the nodes, and the allocatable
    resources tell whether the node has room for its slots."""

    name: str
    label_value: str
    cpu_millis: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class ObservedPod:
    """A pod of the testbed as the cluster shows it.

    Ghost pods carry their ``position_on_node`` and resources; a job's pod is known by name and is
    attributed to a slot through its reservation. ``node`` is ``None`` while the pod is unbound.
    ``failed``: a ghost pod that ended (phase Failed or Succeeded) or was evicted; it holds no
    slot and is replaced under a fresh name.
    """

    name: str
    uid: str
    node: str | None
    ghost: bool
    position_on_node: int | None = None
    cpu_millis: int = 0
    memory_mib: int = 0
    terminating: bool = False
    failed: bool = False


@dataclass(frozen=True, slots=True)
class GhostPod:
    """A ghost pod the reconciler must create: it requests one slot's resources on its node."""

    name: str
    node: str
    position_on_node: int
    slot_id: int
    cpu_millis: int
    memory_mib: int


# -- commands ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DefineTestbed:
    """Create or resize the testbed. Resizing is allowed; the reconciler replaces the ghosts."""

    name: str
    node_label: str
    slots_per_node: int
    cpu_millis: int
    memory_mib: int
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ObserveCluster:
    """What the cluster shows now: the labelled nodes and the testbed's pods."""

    nodes: tuple[ObservedNode, ...]
    pods: tuple[ObservedPod, ...]
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ReserveSlot:
    """Reserve, for the pod, the first free slot (by id) among ``slot_ids`` on a candidate node.

    ``candidate_nodes`` ``None`` means any node. A pod that already holds a reservation keeps it
    (the command decides nothing). Sent by the extender (:mod:`~.slots_extender`).
    """

    pod_name: str
    pod_uid: str
    slot_ids: tuple[int, ...]
    candidate_nodes: tuple[str, ...] | None = None
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class DeleteTestbed:
    """Delete the testbed: refused while a scheduling holds it, a no-op once deleted."""

    name: str
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ClaimTestbed:
    """A scheduling takes the testbed (appended atomically with its job claims)."""

    scheduling: str
    _: KW_ONLY
    at: datetime


@dataclass(frozen=True, slots=True)
class ReleaseTestbed:
    """A scheduling gives the testbed back; a no-op if it does not hold it."""

    scheduling: str
    _: KW_ONLY
    at: datetime


TestbedCommand: TypeAlias = (
    DefineTestbed | ObserveCluster | ReserveSlot | ClaimTestbed | ReleaseTestbed | DeleteTestbed
)


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TestbedDefined:
    """The testbed's shape (first event, and again on every resize)."""

    name: str
    node_label: str
    slots_per_node: int
    cpu_millis: int
    memory_mib: int
    at: datetime


@dataclass(frozen=True, slots=True)
class ClusterObserved:
    """The cluster changed: the labelled nodes and the testbed's pods now are these."""

    nodes: tuple[ObservedNode, ...]
    pods: tuple[ObservedPod, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class SlotReserved:
    """The slot is reserved for the pod; the ghost pod (if still there) is its victim."""

    slot_id: int
    node: str
    position_on_node: int
    pod_name: str
    pod_uid: str
    ghost_pod: str | None
    ghost_uid: str | None
    at: datetime


@dataclass(frozen=True, slots=True)
class ReservationCleared:
    """The reservation ended: its pod is gone, or its node left the testbed."""

    slot_id: int
    node: str
    position_on_node: int
    pod_name: str
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class TestbedClaimed:
    """A scheduling holds the testbed."""

    scheduling: str
    at: datetime


@dataclass(frozen=True, slots=True)
class TestbedReleased:
    """The scheduling no longer holds the testbed."""

    scheduling: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ProblemsReported:
    """What needs an operator changed: these are the testbed's problems now (``()``: none)."""

    problems: tuple[str, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class TestbedDeleted:
    """The testbed is deleted: no slots, every ghost pod goes."""

    name: str
    at: datetime


TestbedEvent: TypeAlias = (
    TestbedDefined
    | ClusterObserved
    | SlotReserved
    | ReservationCleared
    | TestbedClaimed
    | TestbedReleased
    | ProblemsReported
    | TestbedDeleted
)


# -- state ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TestbedState:
    """One testbed. Reservations are keyed by (node, position): slot ids renumber when nodes
    come and go, the place of a slot does not."""

    defined: TestbedDefined | None = None
    nodes: tuple[ObservedNode, ...] = ()
    pods: tuple[ObservedPod, ...] = ()
    observed_at: datetime | None = None
    reservations: Mapping[tuple[str, int], SlotReserved] = field(default_factory=dict)
    holder: str | None = None
    problems: tuple[str, ...] = ()
    """What needs an operator, as last reported (:class:`ProblemsReported`)."""
    deleted: bool = False
    generations: Mapping[tuple[str, int], int] = field(default_factory=dict)
    """Per (node, position): how many of the slot's ghost pods were observed failed."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One slot and what holds it."""

    slot_id: int
    node: str
    position_on_node: int
    status: SlotStatus
    ghost_pod: ObservedPod | None
    reserved_for: str | None
    """The name of the pod the slot is reserved for (reserved or occupied)."""


@dataclass(frozen=True, slots=True)
class ReconcilePlan:
    """What the reconciler must do to make observed ghost pods match the desired ones."""

    create: tuple[GhostPod, ...]
    delete: tuple[tuple[str, str], ...]
    """(name, uid) of each pod to delete: the uid is the delete's precondition, so a stale
    decision never removes a newer pod that took the name."""
    problems: tuple[str, ...]
    """What the reconciler cannot fix by itself, for an operator to read."""


def initial_state() -> TestbedState:
    """A testbed stream with no events."""
    return TestbedState()


def evolve(state: TestbedState, event: TestbedEvent) -> TestbedState:
    """Apply one event. Events are facts: nothing here refuses them."""
    if isinstance(event, TestbedDefined):
        return replace(state, defined=event, deleted=False)
    if isinstance(event, ClusterObserved):
        generations = _next_generations(state, event.pods)
        return replace(
            state, nodes=event.nodes, pods=event.pods, observed_at=event.at, generations=generations
        )
    if isinstance(event, SlotReserved):
        key = (event.node, event.position_on_node)
        return replace(state, reservations={**state.reservations, key: event})
    if isinstance(event, ReservationCleared):
        key = (event.node, event.position_on_node)
        kept = {k: v for k, v in state.reservations.items() if k != key}
        return replace(state, reservations=kept)
    if isinstance(event, TestbedClaimed):
        return replace(state, holder=event.scheduling)
    if isinstance(event, TestbedReleased):
        return replace(state, holder=None)
    if isinstance(event, ProblemsReported):
        return replace(state, problems=event.problems)
    if isinstance(event, TestbedDeleted):
        # The observations stay (the reconciler deletes the ghosts they show) and so do the
        # generations: a re-created testbed must not reuse the name of a pod that may linger.
        return replace(state, deleted=True, reservations={}, problems=())
    raise TypeError(f"not a testbed event: {event!r}")


def _next_generations(
    state: TestbedState, pods: Iterable[ObservedPod]
) -> Mapping[tuple[str, int], int]:
    """The generations after observing ``pods``: a failed ghost under its slot's current name
    moves that slot on by one. Seeing the same failed pod again changes nothing, since its name is
    no longer the current one."""
    defined = state.defined
    if defined is None:
        return state.generations
    generations = dict(state.generations)
    for pod in pods:
        if not (pod.ghost and pod.failed and pod.node is not None):
            continue
        if pod.position_on_node is None:
            continue
        key = (pod.node, pod.position_on_node)
        current = generations.get(key, 0)
        if pod.name == _ghost_name(defined, pod.node, pod.position_on_node, current):
            generations[key] = current + 1
    return generations


# -- queries -------------------------------------------------------------------------------------

_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")


def _node_order(node: ObservedNode) -> tuple[int, int, str, str]:
    # The original parses the label value as the node's number; a value that is no number keeps
    # its string order, after every numeric one.
    value = node.label_value.strip()
    if _WHOLE_NUMBER.fullmatch(value):
        return (0, int(value), "", node.name)
    return (1, 0, node.label_value, node.name)


def _ordered_nodes(state: TestbedState) -> list[ObservedNode]:
    return sorted(state.nodes, key=_node_order)


def _places(state: TestbedState) -> list[tuple[int, ObservedNode, int]]:
    """(slot id, node, position) of every desired slot, numbered round-robin."""
    if state.defined is None or state.deleted:
        return []
    nodes = _ordered_nodes(state)
    order = [(pos, node) for pos in range(state.defined.slots_per_node) for node in nodes]
    return [(slot_id, node, pos) for slot_id, (pos, node) in enumerate(order)]


def ghost_pod_name(
    testbed: str,
    node: str,
    position_on_node: int,
    cpu: int,
    memory: int,
    *,
    generation: int = 0,
) -> str:
    """The ghost pod's name. It carries the size so a resize never reuses a name still held by a
    terminating pod of the old size, and from the first replacement of a failed ghost on, the
    slot's generation (``-g1``, ``-g2``, …) so a replacement never reuses the failed pod's name."""
    base = f"{testbed}-ghost-{node}-{position_on_node}-{cpu}m-{memory}mi"
    return base if generation == 0 else f"{base}-g{generation}"


def _ghost_name(defined: TestbedDefined, node: str, pos: int, generation: int) -> str:
    return ghost_pod_name(
        defined.name, node, pos, defined.cpu_millis, defined.memory_mib, generation=generation
    )


def ghost_generation(state: TestbedState, node: str, position_on_node: int) -> int:
    """How many ghost pods of the slot at (node, position) were observed failed: the generation
    its next ghost pod is named with."""
    return state.generations.get((node, position_on_node), 0)


def _is_desired_ghost(pod: ObservedPod, defined: TestbedDefined, node: str, pos: int) -> bool:
    # Seed 05: an observed ghost equals a desired one when node, size and position on node match.
    return (
        pod.ghost
        and not pod.terminating
        and not pod.failed
        and pod.node == node
        and pod.position_on_node == pos
        and pod.cpu_millis == defined.cpu_millis
        and pod.memory_mib == defined.memory_mib
    )


def slots(state: TestbedState) -> tuple[Slot, ...]:
    """Every desired slot by id, with its state (see the module docstring); none once the
    testbed is deleted."""
    return _indexed(state)[0]


_SlotsIndex: TypeAlias = tuple[tuple[Slot, ...], Mapping[str, Slot]]
_MEMO_SIZE = 8
_memo: tuple[tuple[TestbedState, _SlotsIndex], ...] = ()
"""The slots (and each pod's reserved slot) of the last few states asked about, newest first.
The extender asks about a handful of states at once (the fold answering re-asks, the one a
reservation is decided on, the one after it) many times per second; states are immutable, so
the same object has the same slots. Replaced whole: a thread reads the old tuple or the new."""


def _indexed(state: TestbedState) -> _SlotsIndex:
    global _memo  # noqa: PLW0603 - a small memo, replaced whole
    memo = _memo
    for known, index in memo:
        if known is state:
            return index
    result = _slots(state)
    holders: dict[str, Slot] = {}
    for slot in result:
        if slot.reserved_for is not None:
            holders.setdefault(slot.reserved_for, slot)
    index = (result, holders)
    _memo = ((state, index), *memo[: _MEMO_SIZE - 1])
    return index


@dataclass(frozen=True, slots=True)
class _Place:
    """A desired slot's place and the observed ghosts there, which depend on the testbed's
    definition, nodes and pods alone: not on its reservations, which change far more often."""

    slot_id: int
    node: str
    position_on_node: int
    ghost: ObservedPod | None
    """The first desired ghost by name."""
    conflicting: bool
    """More than one desired ghost, or a node without room for its slots."""


_last_layout: tuple[tuple[object, ...], tuple[_Place, ...], Mapping[str, str | None]] | None = None


def _layout(
    state: TestbedState, defined: TestbedDefined
) -> tuple[tuple[_Place, ...], Mapping[str, str | None]]:
    """The places of ``state``'s slots, and each observed pod's node by name: kept for the last
    (definition, nodes, pods) seen, which a reservation's state shares with the state before."""
    global _last_layout  # noqa: PLW0603 - a one-entry memo, replaced whole
    key: tuple[object, ...] = (defined, state.nodes, state.pods)
    last = _last_layout
    if last is not None and all(a is b for a, b in zip(last[0], key, strict=True)):
        return last[1], last[2]
    pod_nodes = {p.name: p.node for p in state.pods}
    # Ghosts by their place, built once: scanning every pod for every slot is quadratic.
    ghosts_at: dict[tuple[str | None, int | None], list[ObservedPod]] = {}
    for observed in state.pods:
        ghosts_at.setdefault((observed.node, observed.position_on_node), []).append(observed)
    cramped = set(_cramped_nodes(state))
    places: list[_Place] = []
    for slot_id, node, pos in _places(state):
        ghosts = sorted(
            (
                p
                for p in ghosts_at.get((node.name, pos), ())
                if _is_desired_ghost(p, defined, node.name, pos)
            ),
            key=lambda p: p.name,
        )
        places.append(
            _Place(
                slot_id,
                node.name,
                pos,
                ghosts[0] if ghosts else None,
                len(ghosts) > 1 or node.name in cramped,
            )
        )
    layout = tuple(places)
    _last_layout = (key, layout, pod_nodes)
    return layout, pod_nodes


_last_built: tuple[tuple[_Place, ...], tuple[Slot, ...]] | None = None


def _slots(state: TestbedState) -> tuple[Slot, ...]:
    global _last_built  # noqa: PLW0603 - a one-entry memo, replaced whole
    defined = state.defined
    if defined is None or state.deleted:
        return ()
    places, pod_nodes = _layout(state, defined)
    # Consecutive states mostly differ in one reservation: the slots that did not change are
    # taken from the last result over the same places rather than built again.
    built = _last_built
    previous = built[1] if built is not None and built[0] is places else None
    reservations = state.reservations
    result: list[Slot] = []
    for i, place in enumerate(places):
        reservation = reservations.get((place.node, place.position_on_node))
        status: SlotStatus
        if place.conflicting:
            status = "error"
        elif reservation is not None:
            status = _reserved_status(pod_nodes.get(reservation.pod_name), place.node)
        else:
            status = "free" if place.ghost is not None else "creating"
        holder = None if reservation is None else reservation.pod_name
        if previous is not None:
            before = previous[i]
            if before.status == status and before.reserved_for == holder:
                result.append(before)
                continue
        result.append(
            Slot(place.slot_id, place.node, place.position_on_node, status, place.ghost, holder)
        )
    done = tuple(result)
    _last_built = (places, done)
    return done


def _reserved_status(bound: str | None, node: str) -> SlotStatus:
    if bound is None:
        return "reserved"
    return "occupied" if bound == node else "error"


def free_slot_ids(state: TestbedState) -> tuple[int, ...]:
    """The ids of the free slots, ascending: what a scheduling can hand out."""
    return tuple(s.slot_id for s in slots(state) if s.status == "free")


def usable_slot_ids(state: TestbedState) -> tuple[int, ...]:
    """The ids of every slot that can hold a job, free now or not (those on a node without room
    for its slots cannot): what a scheduling could ever have free at once."""
    cramped = set(_cramped_nodes(state))
    return tuple(s.slot_id for s in slots(state) if s.node not in cramped)


def nodes_of(state: TestbedState, slot_ids: Iterable[int]) -> tuple[str, ...]:
    """The nodes the given slots are on, sorted: a job's pods' node affinity."""
    wanted = set(slot_ids)
    return tuple(sorted({s.node for s in slots(state) if s.slot_id in wanted}))


def reservation_of(state: TestbedState, pod_name: str) -> Slot | None:
    """The slot reserved for (or occupied by) the named pod, if any."""
    return _indexed(state)[1].get(pod_name)


def _cramped_nodes(state: TestbedState) -> dict[str, str]:
    """The nodes without room for their slots, each with the problem to report."""
    defined = state.defined
    if defined is None or state.deleted:
        return {}
    need_cpu = defined.slots_per_node * defined.cpu_millis
    need_memory = defined.slots_per_node * defined.memory_mib
    return {
        n.name: f"node {n.name} has {n.cpu_millis}m CPU and {n.memory_mib}Mi memory allocatable "
        f"but its {defined.slots_per_node} slots need {need_cpu}m and {need_memory}Mi; its ghost "
        "pods are removed until you lower slots_per_node or the slot size, or remove the node's "
        "label"
        for n in _ordered_nodes(state)
        if n.cpu_millis < need_cpu or n.memory_mib < need_memory
    }


def _problems(state: TestbedState) -> tuple[str, ...]:
    """What needs an operator: nodes without room, then slots in error on the other nodes."""
    cramped = _cramped_nodes(state)
    problems = list(cramped.values())
    for slot in slots(state):
        if slot.status == "error" and slot.node not in cramped:
            problems.append(
                f"slot {slot.slot_id} on node {slot.node} holds conflicting pods"
                + (f" (reserved for {slot.reserved_for})" if slot.reserved_for else "")
            )
    return tuple(problems)


def reconcile(state: TestbedState) -> ReconcilePlan:
    """The diff of desired against observed ghost pods.

    * a slot with no reservation and no ghost pod gets one created, named with the slot's
      generation;
    * a ghost pod that matches no desired slot (its node left, the size or slot count changed),
      a failed ghost, a second ghost pod of one slot, the ghost pod of an occupied slot (its
      preemption is done), every ghost on a node without room for its slots and, once the testbed
      is deleted, every ghost are deleted; terminating pods are already going and are left alone;
    * nodes without room for their slots and slots in error are reported as problems.
    """
    defined = state.defined
    if defined is None:
        return ReconcilePlan((), (), ())
    keep: set[str] = set()
    create: list[GhostPod] = []
    cramped = _cramped_nodes(state)
    for slot in slots(state):
        if slot.node in cramped:
            continue
        if slot.ghost_pod is not None and slot.status != "occupied":
            keep.add(slot.ghost_pod.name)
        if slot.status == "creating":
            generation = ghost_generation(state, slot.node, slot.position_on_node)
            create.append(
                GhostPod(
                    _ghost_name(defined, slot.node, slot.position_on_node, generation),
                    slot.node,
                    slot.position_on_node,
                    slot.slot_id,
                    defined.cpu_millis,
                    defined.memory_mib,
                )
            )
    delete = sorted(
        (p.name, p.uid) for p in state.pods if p.ghost and not p.terminating and p.name not in keep
    )
    return ReconcilePlan(tuple(create), tuple(delete), _problems(state))


def overall_state(state: TestbedState) -> OverallState:
    """``error`` if anything needs an operator, else ``running`` if any slot is occupied, else
    ``in_progress`` while reservations or ghost pods are pending, else ``success``."""
    all_slots = slots(state)
    statuses = {s.status for s in all_slots}
    if "error" in statuses or _cramped_nodes(state):
        return "error"
    if "occupied" in statuses:
        return "running"
    if statuses - {"free"} or reconcile(state).delete:
        return "in_progress"
    return "success"


# -- decide --------------------------------------------------------------------------------------


def decide(state: TestbedState, command: TestbedCommand) -> list[TestbedEvent]:
    """Decide what ``command`` means for the testbed. Raises :class:`Rejected` /
    :class:`InvalidCommand` with a reason that says what to do instead."""
    at = _utc(command.at)
    if isinstance(command, DefineTestbed):
        return _decide_define(state, command, at)
    defined = state.defined
    if defined is None:
        raise Rejected("the testbed is not defined yet; define it with DefineTestbed first")
    if isinstance(command, ObserveCluster):
        return _decide_observe(state, command, at)
    if isinstance(command, DeleteTestbed):
        return _decide_delete(state, defined, command, at)
    if state.deleted:
        raise Rejected(f"testbed {defined.name} is deleted; define it again to use it")
    if isinstance(command, ReserveSlot):
        return _decide_reserve(state, command, at)
    if isinstance(command, ClaimTestbed):
        if state.holder == command.scheduling:
            return []
        if state.holder is not None:
            raise Rejected(
                f"testbed {defined.name} is held by scheduling {state.holder}; "
                "wait until it is released"
            )
        return [TestbedClaimed(command.scheduling, at)]
    if isinstance(command, ReleaseTestbed):
        if state.holder != command.scheduling:
            return []
        return [TestbedReleased(command.scheduling, at)]
    raise InvalidCommand(f"a testbed does not handle {type(command).__name__}")


def _utc(at: object) -> datetime:
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InvalidCommand(f"at must be a timezone-aware UTC datetime, got {at!r}")
    return at.astimezone(UTC)


def _decide_define(state: TestbedState, command: DefineTestbed, at: datetime) -> list[TestbedEvent]:
    if not command.name or not command.node_label:
        raise InvalidCommand("a testbed needs a name and a node label")
    if state.defined is not None and state.defined.name != command.name:
        raise InvalidCommand(
            f"command for testbed {command.name} sent to the stream of {state.defined.name}"
        )
    for what, value in (
        ("slots_per_node", command.slots_per_node),
        ("cpu_millis", command.cpu_millis),
        ("memory_mib", command.memory_mib),
    ):
        if type(value) is not int or value < 1:
            raise InvalidCommand(f"{what} must be a positive integer, got {value!r}")
    event = TestbedDefined(
        command.name,
        command.node_label,
        command.slots_per_node,
        command.cpu_millis,
        command.memory_mib,
        at,
    )
    if state.defined is not None and not state.deleted and replace(state.defined, at=at) == event:
        return []
    return [event]


def _decide_delete(
    state: TestbedState, defined: TestbedDefined, command: DeleteTestbed, at: datetime
) -> list[TestbedEvent]:
    if command.name != defined.name:
        raise InvalidCommand(
            f"command for testbed {command.name} sent to the stream of {defined.name}"
        )
    if state.deleted:
        return []
    if state.holder is not None:
        raise Rejected(
            f"testbed {defined.name} is held by scheduling {state.holder}; "
            "release that scheduling first"
        )
    return [TestbedDeleted(defined.name, at)]


def _decide_observe(
    state: TestbedState, command: ObserveCluster, at: datetime
) -> list[TestbedEvent]:
    for what, names in (
        ("node", [n.name for n in command.nodes]),
        ("pod", [p.name for p in command.pods]),
    ):
        if len(set(names)) != len(names):
            raise InvalidCommand(f"the observation lists a {what} twice")
    # Sorted by name, so the same cluster listed in another order is not a change.
    nodes = tuple(sorted(command.nodes, key=lambda n: n.name))
    pods = tuple(sorted(command.pods, key=lambda p: p.name))
    events: list[TestbedEvent] = []
    if (nodes, pods) != (state.nodes, state.pods):
        events.append(ClusterObserved(nodes, pods, at))
    node_names = {n.name for n in command.nodes}
    pods_by_name = {p.name: p for p in command.pods}
    for (node, pos), reservation in sorted(state.reservations.items()):
        reason = None
        pod = pods_by_name.get(reservation.pod_name)
        if node not in node_names:
            reason = f"node {node} left the testbed"
        # A reservation is made for a pod that exists, so only an observation taken after it
        # proves the pod gone; an older snapshot may simply predate the pod.
        elif pod is None and at > reservation.at:
            reason = f"pod {reservation.pod_name} is gone"
        elif pod is not None and _replaced(pod, reservation):
            reason = f"pod {reservation.pod_name} was replaced by a new pod of that name"
        if reason is not None:
            events.append(
                ReservationCleared(reservation.slot_id, node, pos, reservation.pod_name, reason, at)
            )
    after = state
    for event in events:
        after = evolve(after, event)
    problems = _problems(after)
    if problems != state.problems:
        events.append(ProblemsReported(problems, at))
    return events


def _replaced(pod: ObservedPod, reservation: SlotReserved) -> bool:
    """A new pod took the reserved pod's name (an application run again): the old pod's slot is
    free. Only known when both uids are."""
    return bool(pod.uid and reservation.pod_uid) and pod.uid != reservation.pod_uid


def _decide_reserve(state: TestbedState, command: ReserveSlot, at: datetime) -> list[TestbedEvent]:
    if not command.slot_ids:
        raise InvalidCommand(f"pod {command.pod_name} names no slot ids; it cannot be placed")
    if reservation_of(state, command.pod_name) is not None:
        return []
    wanted = set(command.slot_ids)
    candidates = None if command.candidate_nodes is None else set(command.candidate_nodes)
    listed = [s for s in slots(state) if s.slot_id in wanted]
    for slot in listed:
        if slot.status == "free" and (candidates is None or slot.node in candidates):
            ghost = slot.ghost_pod
            return [
                SlotReserved(
                    slot.slot_id,
                    slot.node,
                    slot.position_on_node,
                    command.pod_name,
                    command.pod_uid,
                    None if ghost is None else ghost.name,
                    None if ghost is None else ghost.uid,
                    at,
                )
            ]
    summary = ", ".join(f"{s.slot_id} {s.status} on {s.node}" for s in listed) or "none exist"
    raise Rejected(
        f"no free slot for pod {command.pod_name} among slots "
        f"{', '.join(map(str, sorted(wanted)))} on the candidate nodes ({summary}); "
        "it waits until one of its slots is free"
    )
