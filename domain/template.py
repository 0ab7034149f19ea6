"""Machine templates and their hash: requests with equal hashes can share one cloud call.

Seed 01 ("How Requests Are Grouped"): the hash covers every field that must be identical across a
batch; per-machine variations (machine name, zones, tags) travel in the ``BatchPutMachine`` header
instead and never enter the hash.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Literal

from fleetledger.domain.errors import InvalidCommand

__all__ = [
    "KUBELET_CONFIG_LIMITS",
    "MAX_PODS_RANGE",
    "OS_DISK_SIZE_GB_RANGE",
    "TEMPLATE_TEXT_LIMIT",
    "UNSAFE_CHARACTERS",
    "MachineTemplate",
    "Priority",
    "check_template",
    "check_text",
    "text_problem",
    "template_hash",
]

Priority = Literal["spot", "regular"]

_TEXT_FIELDS = (
    "vm_size",
    "mode",
    "gpu_profile",
    "orchestrator_version",
    "os_sku",
    "os_disk_type",
    "vnet_subnet_id",
)
_COUNT_FIELDS = ("max_pods", "os_disk_size_gb")

MAX_PODS_RANGE = (10, 250)
"""AKS accepts 10 to 250 pods per node (``maxPods``), whatever the network plugin."""
OS_DISK_SIZE_GB_RANGE = (30, 2048)
"""AKS caps ``osDiskSizeGB`` at 2048; below 30 GB no AKS node image fits."""
TEMPLATE_TEXT_LIMIT = 1024
"""Longest template text (a subnet's resource id is the longest real value, well under this)."""
KUBELET_CONFIG_LIMITS = (32, 128, 256)
"""At most 32 kubelet settings, keys of at most 128 and values of at most 256 characters."""

# Control characters (C0, DEL, C1) and UTF-16 surrogates. A NUL cannot be stored in Postgres text
# (the seal of its batch failed forever), a lone surrogate cannot be encoded as UTF-8 at all, and
# the rest turn into invisible differences between names that look equal.
UNSAFE_CHARACTERS = r"\x00-\x1f\x7f-\x9f\ud800-\udfff"
"""Control characters and lone surrogates, as a regular expression character range: text the
log could not store, or that would reach Azure as something else."""
_UNSAFE = re.compile(f"[{UNSAFE_CHARACTERS}]")


@dataclass(frozen=True, slots=True)
class MachineTemplate:
    """Everything about a machine that is shared by all machines of one batch."""

    vm_size: str
    priority: Priority = "regular"
    mode: str = "User"
    gpu_profile: str | None = None
    orchestrator_version: str | None = None
    max_pods: int | None = None
    kubelet_config: tuple[tuple[str, str], ...] = field(default=())
    os_sku: str | None = None
    os_disk_size_gb: int | None = None
    os_disk_type: str | None = None
    enable_fips: bool = False
    vnet_subnet_id: str | None = None

    def __post_init__(self) -> None:
        # Equal templates must have equal hashes, and ``template_hash`` is memoised on equality,
        # so values that compare equal but encode differently (``0`` vs ``False``, ``30`` vs
        # ``30.0``) are refused here instead of splitting or merging batches by accident.
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidCommand(f"{name} must be a string, got {value!r}")
        if not self.vm_size:
            raise InvalidCommand("vm_size must name a VM size, e.g. 'Standard_D4s_v5'")
        if self.priority not in ("spot", "regular"):
            raise InvalidCommand(f"priority must be 'spot' or 'regular', got {self.priority!r}")
        for name in _COUNT_FIELDS:
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value <= 0):
                raise InvalidCommand(f"{name} must be a positive integer or absent, got {value!r}")
        if type(self.enable_fips) is not bool:
            raise InvalidCommand(f"enable_fips must be true or false, got {self.enable_fips!r}")
        self._canonicalise_kubelet_config()

    def _canonicalise_kubelet_config(self) -> None:
        # The hash already ignores kubelet_config order (it goes through a JSON object), so
        # equality must too: otherwise two templates with one hash could compare unequal and an
        # idempotent retry would look like a conflicting one. Duplicate keys are refused rather
        # than "last one wins", which would silently drop a setting.
        pairs = tuple(self.kubelet_config)
        for pair in pairs:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise InvalidCommand(f"kubelet_config entries must be (key, value) pairs: {pair!r}")
            if not all(isinstance(part, str) for part in pair):
                raise InvalidCommand(
                    f"kubelet_config entries must be (key, value) strings: {pair!r}"
                )
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            duplicates = sorted({key for key in keys if keys.count(key) > 1})
            raise InvalidCommand(
                f"kubelet_config sets {', '.join(duplicates)} more than once; give each key once"
            )
        canonical = tuple(sorted(pairs))
        if canonical != self.kubelet_config:
            object.__setattr__(self, "kubelet_config", canonical)

    def to_data(self) -> dict[str, object]:
        """JSON-ready form; ``kubelet_config`` becomes an object."""
        # Every field but kubelet_config holds an immutable scalar, so the values are taken as
        # they are: asdict's recursive deep copy cost nearly seven times as much, once per request.
        data: dict[str, object] = {name: getattr(self, name) for name in _FIELD_NAMES}
        data["kubelet_config"] = dict(self.kubelet_config)
        return data

    @classmethod
    def from_data(cls, data: dict[str, object]) -> MachineTemplate:
        """Inverse of :meth:`to_data`; unknown keys are refused so typos do not split batches."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown machine template field(s): {', '.join(unknown)}")
        values = dict(data)
        kubelet = values.get("kubelet_config") or {}
        if not isinstance(kubelet, dict):
            raise ValueError("kubelet_config must be an object of string values")
        values["kubelet_config"] = tuple(sorted((str(k), str(v)) for k, v in kubelet.items()))
        try:
            return cls(**values)  # type: ignore[arg-type]
        except TypeError as e:  # a required field is missing
            raise ValueError(f"machine template is incomplete: {e}") from e


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored and sent as it is, or ``None`` if it can."""
    found = _UNSAFE.search(value)
    if found is None:
        return None
    char = found.group()
    kind = "a UTF-16 surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
    return f"contains {kind} (U+{ord(char):04X}) at position {found.start()}; remove it"


def check_text(name: str, value: str, *, max_length: int, blank: bool = False) -> None:
    """Refuse ``value`` (called ``name`` in the message) if it is unsafe, too long, or blank.

    Raises :class:`InvalidCommand` whose message starts with ``name``.
    """
    visible = blank or (value and not value.isspace())
    if visible and len(value) <= max_length and not _UNSAFE.search(value):
        return  # the common case, decided in one pass over the text
    if len(value) > max_length:
        raise InvalidCommand(f"{name} is {len(value)} characters long; the limit is {max_length}")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidCommand(f"{name} {problem}")
    if not blank and not value.strip():
        raise InvalidCommand(f"{name} must not be empty or only whitespace, got {value!r}")


def check_template(template: MachineTemplate) -> None:
    """Refuse a template Azure would refuse, or that cannot be stored: raises
    :class:`InvalidCommand` whose message starts with ``template <field>``.

    Kept out of ``__post_init__`` on purpose: templates decoded from the log must load whatever
    the limits say today, or one old event would stop its stream from folding.
    """
    problem = _template_problem(template)
    if problem is not None:
        raise InvalidCommand(problem)


# Every request is checked and a burst uses a handful of templates: memoised like the hash.
@lru_cache(maxsize=1024)
def _template_problem(template: MachineTemplate) -> str | None:
    try:
        _check_template_fields(template)
    except InvalidCommand as e:
        return e.reason
    return None


def _check_template_fields(template: MachineTemplate) -> None:
    for name in _TEXT_FIELDS:
        value = getattr(template, name)
        if value is not None:
            check_text(f"template {name}", value, max_length=TEMPLATE_TEXT_LIMIT)
    for name, (low, high) in (
        ("max_pods", MAX_PODS_RANGE),
        ("os_disk_size_gb", OS_DISK_SIZE_GB_RANGE),
    ):
        value = getattr(template, name)
        if value is not None and not low <= value <= high:
            raise InvalidCommand(
                f"template {name} must be between {low} and {high} (Azure's range), got {value}"
            )
    most, key_length, value_length = KUBELET_CONFIG_LIMITS
    if len(template.kubelet_config) > most:
        raise InvalidCommand(
            f"template kubelet_config has {len(template.kubelet_config)} settings; "
            f"the limit is {most}"
        )
    for key, value in template.kubelet_config:
        check_text("template kubelet_config key", key, max_length=key_length)
        check_text(f"template kubelet_config {key}", value, max_length=value_length, blank=True)


def template_hash(template: MachineTemplate) -> str:
    """SHA-256 of the template's canonical JSON, first 16 hex characters.

    Canonical means: sorted keys, compact separators, and one spelling for "absent" — a field that
    is ``None`` (or an empty kubelet config) is left out, so adding a new optional field later does
    not change the hash of templates that do not set it.
    """
    return _memoised_hash(template)


_FIELD_NAMES = tuple(f.name for f in fields(MachineTemplate))


# The grouper hashes every request; a burst uses a handful of templates, so memoising on template
# equality turns its json + sha256 into a dict lookup. Pure: same input, same output.
@lru_cache(maxsize=1024)
def _memoised_hash(template: MachineTemplate) -> str:
    canonical = {k: v for k, v in template.to_data().items() if v is not None and v != {}}
    encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()[:16]
