"""What the kube-scheduler extender answers, as pure functions of a testbed's state.

A job's pods all carry the whole application's slot ids (seed 05, "Extender"): the application
operator creates them from one pod template, so the extender picks each pod's slot. For a pod it
is asked about, it first looks for a slot already reserved for that pod, else it reserves the
first free slot (by id) from the pod's list, and then

* ``filter`` answers with that slot's node only (none free: no node, and the reason for each
  candidate, so the kube-scheduler falls back to preemption);
* ``preempt`` answers with that slot's node and, as the victim, the slot's ghost pod — and no node
  when that slot has no ghost pod left to evict (the kube-scheduler refuses a preemption answer
  without victims) or lies off the candidate nodes the scheduler sent.

A new reservation is a :class:`~fleetledger.domain.testbeds.SlotReserved` event the caller must
append to the testbed's stream with its expected version *before* answering: two pods racing for
one slot then conflict in the log, and the loser is decided again on the new state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from fleetledger.domain.errors import Rejected
from fleetledger.domain.testbeds import testbed

__all__ = ["FilterDecision", "PodToPlace", "PreemptDecision", "filter_pod", "preempt_pod"]


@dataclass(frozen=True, slots=True)
class PodToPlace:
    """The pod the kube-scheduler asks about, with the slot ids it may use."""

    name: str
    uid: str
    slot_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FilterDecision:
    """``nodes`` the pod may go to (at most one); ``failed`` says why each other candidate
    cannot take it."""

    nodes: tuple[str, ...]
    failed: Mapping[str, str]
    events: tuple[testbed.TestbedEvent, ...]


@dataclass(frozen=True, slots=True)
class PreemptDecision:
    """The node for the pod and the UIDs of the pods to evict there (its slot's ghost pod), or no
    node and the reason."""

    node: str | None
    victim_uids: tuple[str, ...]
    events: tuple[testbed.TestbedEvent, ...]
    reason: str = ""


def _reserve(
    state: testbed.TestbedState,
    pod: PodToPlace,
    candidate_nodes: tuple[str, ...] | None,
    at: datetime,
) -> tuple[testbed.Slot | None, tuple[testbed.TestbedEvent, ...], str]:
    command = testbed.ReserveSlot(pod.name, pod.uid, pod.slot_ids, candidate_nodes, at=at)
    try:
        events = tuple(testbed.decide(state, command))
    except Rejected as e:
        return None, (), e.reason
    for event in events:
        state = testbed.evolve(state, event)
    return testbed.reservation_of(state, pod.name), events, ""


def filter_pod(
    state: testbed.TestbedState,
    pod: PodToPlace,
    candidate_nodes: tuple[str, ...],
    *,
    at: datetime,
) -> FilterDecision:
    """The extender's ``filter``: the node of the pod's slot, reserving one if it has none."""
    slot, events, reason = _reserve(state, pod, candidate_nodes, at)
    if slot is None:
        return FilterDecision((), dict.fromkeys(candidate_nodes, reason), ())
    elsewhere = f"pod {pod.name} has slot {slot.slot_id}, which is on node {slot.node}"
    if slot.node not in candidate_nodes:
        return FilterDecision((), dict.fromkeys(candidate_nodes, elsewhere), events)
    failed = {n: elsewhere for n in candidate_nodes if n != slot.node}
    return FilterDecision((slot.node,), failed, events)


def preempt_pod(
    state: testbed.TestbedState,
    pod: PodToPlace,
    *,
    at: datetime,
    candidate_nodes: tuple[str, ...] | None = None,
) -> PreemptDecision:
    """The extender's ``preempt``: the node of the pod's slot, reserving one if it has none, and
    that slot's ghost pod as the victim.

    ``candidate_nodes`` are the nodes the kube-scheduler offered (the keys of its
    ``NodeNameToVictims``/``NodeNameToMetaVictims``; ``None``: any node): a new reservation is
    made only there, as the original does. The scheduler stops simulating at the first possible
    preemption, so beyond them only the preemptor pod carries information (seed 05).
    """
    slot, events, reason = _reserve(state, pod, candidate_nodes, at)
    if slot is None:
        return PreemptDecision(None, (), (), reason)
    if candidate_nodes is not None and slot.node not in candidate_nodes:
        return PreemptDecision(
            None,
            (),
            events,
            f"pod {pod.name} has slot {slot.slot_id}, which is on node {slot.node}, not among "
            "the candidate nodes",
        )
    ghost = slot.ghost_pod
    if ghost is None:
        # A preemption answer must name victims; without a ghost pod in the slot there is
        # nothing to evict, and the pod fits (or waits) without preempting.
        return PreemptDecision(
            None,
            (),
            events,
            f"slot {slot.slot_id} on node {slot.node}, reserved for pod {pod.name}, has no ghost "
            "pod left to evict; the pod is placed by filter once the node has room",
        )
    return PreemptDecision(slot.node, (ghost.uid,), events)
