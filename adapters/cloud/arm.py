"""How Azure Resource Manager reports a machine's provisioning, read the same way for virtual
machines and AKS machines."""

from __future__ import annotations

from collections.abc import Sequence

from .port import MachineStatus

__all__ = ["invalid_tag_keys", "provisioning_status", "sole_zone"]

# Azure refuses tag names containing any of these.
_FORBIDDEN_TAG_CHARACTERS = frozenset("<>%&\\?/")

_FAILED_STATES = frozenset({"failed", "canceled"})


def provisioning_status(provisioning_state: str | None) -> MachineStatus:
    """``Succeeded`` and ``Failed``/``Canceled`` are final; any other state is still creating."""
    state = (provisioning_state or "").lower()
    if state == "succeeded":
        return "succeeded"
    if state in _FAILED_STATES:
        return "failed"
    return "creating"


def sole_zone(zones: Sequence[str] | None) -> str | None:
    """The zone a machine was pinned to, if exactly one: the zone a capacity refusal names."""
    return zones[0] if zones and len(zones) == 1 else None


def invalid_tag_keys(tags: Sequence[tuple[str, str]]) -> list[str]:
    """Tag keys Azure would refuse (``/``, ``<``, ``>``, ``%``, ``&``, ``\\``, ``?``), in order."""
    return [key for key, _ in tags if _FORBIDDEN_TAG_CHARACTERS.intersection(key)]
