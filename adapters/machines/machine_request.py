"""What a caller asks for: one machine from a template, with its per-machine variations."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fleetledger.domain.template import MachineTemplate

from .errors import InvalidRequest

__all__ = ["MachineRequest", "Tags"]

Tags = Mapping[str, str] | tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineRequest:
    """One machine to create (the seed's ``CreateRequest``, minus the channel).

    ``tags`` may be a mapping or (key, value) pairs; :attr:`tag_pairs` is their one canonical
    form. ``request_id`` names this attempt and makes a re-sent request idempotent; ``None`` lets
    the service pick a fresh one. ``skip_batching=None`` takes the flag from the context
    (:func:`fleetledger.adapters.machines.context.skip_batching`); ``True``/``False`` overrides it.
    """

    machine_name: str
    template: MachineTemplate
    zones: tuple[str, ...] = ()
    tags: Tags = ()
    request_id: str | None = None
    skip_batching: bool | None = None

    def __post_init__(self) -> None:
        # A bare string is iterable, so "12" would silently become zones ("1", "2").
        if isinstance(self.zones, str):
            raise InvalidRequest(
                f"zones must be a list of zone names like ['1', '2'], got {self.zones!r}",
                field="zones",
            )
        object.__setattr__(self, "zones", tuple(self.zones))
        object.__setattr__(self, "tags", _tag_pairs(self.tags))

    @property
    def tag_pairs(self) -> tuple[tuple[str, str], ...]:
        """Tags as (key, value) pairs sorted by key (repeated keys are left for the grouper to
        refuse, so a typo is reported rather than one value silently dropped)."""
        return _tag_pairs(self.tags)


def _tag_pairs(tags: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    pairs = tags.items() if isinstance(tags, Mapping) else tags
    return tuple(sorted((k, v) for k, v in pairs))
