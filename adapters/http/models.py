"""The HTTP API's bodies: pydantic models, validated once at the edge.

``POST /v1/machines`` takes ``{"requests": [<request>, …]}`` or a single ``<request>`` object
(wrapped into a list of one before validation, so errors always point into ``requests``). The models
forbid unknown fields — a typo in a template field would otherwise split batches silently (the same
reason :meth:`fleetledger.domain.template.MachineTemplate.from_data` refuses unknown keys).

Everything the grouper would refuse is refused here first, with the same limits (imported from the
domain, so the two cannot drift) and written into the OpenAPI schema as patterns, lengths and
ranges: text holds no control characters (NUL included) and no lone surrogates, names are not
blank, numbers lie in Azure's ranges, tags within Azure's count, length and character rules.
Integers may be spelt ``672.0`` — JSON Schema's ``integer`` includes it — but not ``672.5``,
``"672"`` or ``true``.

Request ids (idempotency keys chosen by the caller) are 1-128 characters of ``A-Z a-z 0-9`` and
``. _ : ~ -``, starting with a letter or digit: they appear in status URLs, ``Location`` headers
and logs, where anything else would need escaping. (The URLs are percent-encoded anyway, for ids
the server did not take through this API.)
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from fleetledger.adapters.machines import MachineRequest
from fleetledger.domain.machines import (
    MACHINE_NAME_PATTERN,
    MAX_REQUEST_ID_LENGTH,
    MAX_TAG_KEY_LENGTH,
    MAX_TAG_VALUE_LENGTH,
    MAX_TAGS,
    MAX_ZONE_LENGTH,
    MAX_ZONES,
    TAG_KEY_FORBIDDEN,
)
from fleetledger.domain.template import (
    KUBELET_CONFIG_LIMITS,
    MAX_PODS_RANGE,
    OS_DISK_SIZE_GB_RANGE,
    TEMPLATE_TEXT_LIMIT,
    MachineTemplate,
    text_problem,
)

__all__ = [
    "AcceptedResponse",
    "MAX_REQUESTS_PER_CALL",
    "MachineRequestBody",
    "MachineStatusResponse",
    "MachinesBody",
    "OutcomeError",
    "OutcomeResponse",
    "REQUEST_ID_PATTERN",
    "TemplateBody",
]

MAX_REQUESTS_PER_CALL = 1000
REQUEST_ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:~-]{{0,{MAX_REQUEST_ID_LENGTH - 1}}}$"

_CONTROLS = r"\x00-\x1f\x7f-\x9f"


def _visible(excluded: str = "") -> str:
    """A pattern for text without control characters (or ``excluded``), not only whitespace."""
    allowed = f"[^{_CONTROLS}{excluded}]"
    return f"^{allowed}*[^\\s{_CONTROLS}{excluded}]{allowed}*$"


def _storable(value: object) -> object:
    # Runs before the patterns (which document the rule in the schema) to say which character
    # is at fault and where; it also catches lone surrogates, which no JSON Schema pattern can.
    if isinstance(value, str):
        problem = text_problem(value)
        if problem is not None:
            raise ValueError(problem)
    return value


def _integral(value: object) -> object:
    # 672.0 is an integer to JSON Schema, so it must be one here; 672.5, "672" and true are not.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _keys_by_pattern(schema: dict[str, Any]) -> None:
    # pydantic writes constrained dict keys as ``patternProperties``, which lets keys that do not
    # match through; the API refuses them, so the schema says so with ``propertyNames``.
    patterns = schema.pop("patternProperties", None)
    if patterns:
        ((pattern, values),) = patterns.items()
        schema.setdefault("propertyNames", {})["pattern"] = pattern
        schema["additionalProperties"] = values


_STORABLE = BeforeValidator(_storable)
_ANY_TEXT = f"^[^{_CONTROLS}]*$"
_MAX_KUBELET, _KUBELET_KEY_LENGTH, _KUBELET_VALUE_LENGTH = KUBELET_CONFIG_LIMITS
_MAX_MACHINE_NAME_LENGTH = 63

_TemplateText = Annotated[
    str, Field(min_length=1, max_length=TEMPLATE_TEXT_LIMIT, pattern=_visible()), _STORABLE
]
_KubeletKey = Annotated[
    str, Field(min_length=1, max_length=_KUBELET_KEY_LENGTH, pattern=_visible()), _STORABLE
]
_KubeletValue = Annotated[
    str, Field(max_length=_KUBELET_VALUE_LENGTH, pattern=_ANY_TEXT), _STORABLE
]
_RequestId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_REQUEST_ID_LENGTH, pattern=REQUEST_ID_PATTERN),
    _STORABLE,
]
_MachineName = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_MACHINE_NAME_LENGTH, pattern=MACHINE_NAME_PATTERN),
    _STORABLE,
]
_Zone = Annotated[
    str, Field(min_length=1, max_length=MAX_ZONE_LENGTH, pattern=_visible()), _STORABLE
]
_TagKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_TAG_KEY_LENGTH,
        pattern=_visible(TAG_KEY_FORBIDDEN.replace("\\", "\\\\")),
    ),
    _STORABLE,
]
_TagValue = Annotated[str, Field(max_length=MAX_TAG_VALUE_LENGTH, pattern=_ANY_TEXT), _STORABLE]
# The range sits on the integer, inside the float-to-int step, so the schema shows it as
# ``minimum``/``maximum`` of an ``integer``.
_Pods = Annotated[
    StrictInt, Field(ge=MAX_PODS_RANGE[0], le=MAX_PODS_RANGE[1]), BeforeValidator(_integral)
]
_DiskGb = Annotated[
    StrictInt,
    Field(ge=OS_DISK_SIZE_GB_RANGE[0], le=OS_DISK_SIZE_GB_RANGE[1]),
    BeforeValidator(_integral),
]


class TemplateBody(BaseModel):
    """The shared machine template (docs/ARCHITECTURE.md, "VM creation batching"); every field
    enters the template hash."""

    model_config = ConfigDict(extra="forbid")

    vm_size: _TemplateText = Field(examples=["Standard_D4s_v5"])
    priority: Literal["spot", "regular"] = "regular"
    mode: _TemplateText = "User"
    gpu_profile: _TemplateText | None = None
    orchestrator_version: _TemplateText | None = Field(default=None, examples=["1.31.2"])
    max_pods: _Pods | None = Field(default=None, description="Pods per node; AKS accepts 10-250.")
    kubelet_config: dict[_KubeletKey, _KubeletValue] = Field(
        default_factory=dict, max_length=_MAX_KUBELET, json_schema_extra=_keys_by_pattern
    )
    os_sku: _TemplateText | None = None
    os_disk_size_gb: _DiskGb | None = Field(
        default=None, description="OS disk size in GB; AKS accepts 30-2048."
    )
    os_disk_type: _TemplateText | None = None
    enable_fips: StrictBool = False
    vnet_subnet_id: _TemplateText | None = None

    def to_template(self) -> MachineTemplate:
        """The domain template (raises ``domain.errors.InvalidCommand`` on a value it refuses)."""
        return _template(
            tuple(
                tuple(sorted(value.items())) if isinstance(value, dict) else value
                for value in map(self.__getattribute__, _TEMPLATE_FIELDS)
            )
        )


_TEMPLATE_FIELDS = tuple(TemplateBody.model_fields)


# A burst of requests names a handful of templates; building and validating the same template
# for each request cost the endpoint about as much as parsing the body. The values are strictly
# typed (no 1 for true, no 30.0 for 30), so equal keys mean equal templates, and templates are
# immutable.
@lru_cache(maxsize=256)
def _template(values: tuple[object, ...]) -> MachineTemplate:
    return MachineTemplate(**dict(zip(_TEMPLATE_FIELDS, values, strict=True)))  # type: ignore[arg-type]


class MachineRequestBody(BaseModel):
    """One machine: the template plus its per-machine variations (name, zones, tags)."""

    model_config = ConfigDict(extra="forbid")

    request_id: _RequestId | None = Field(
        default=None,
        description="Idempotency key: re-sending a request with the same id and content "
        "changes nothing. Omitted: the server picks one. 1-128 characters of A-Z a-z 0-9 "
        "and . _ : ~ -, starting with a letter or digit.",
    )
    machine_name: _MachineName = Field(
        description="Becomes the node's host name: 1-63 lowercase letters, digits and '-', "
        "starting and ending with a letter or digit.",
        examples=["aks-user-0001"],
    )
    template: TemplateBody
    zones: list[_Zone] = Field(default_factory=list, max_length=MAX_ZONES)
    tags: dict[_TagKey, _TagValue] = Field(
        default_factory=dict,
        max_length=MAX_TAGS,
        json_schema_extra=_keys_by_pattern,
        description="Azure's rules: at most 50 tags, names of at most 512 characters without "
        "< > % & \\ ? /, values of at most 256 characters.",
    )
    skip_batching: StrictBool = Field(
        default=False,
        description="Give this request its own batch, sealed at once (the seed's "
        "WithSkipBatching): for retries and urgent requests.",
    )

    @field_validator("zones")
    @classmethod
    def _zones_once(cls, zones: list[str]) -> list[str]:
        if len(set(zones)) != len(zones):
            raise ValueError("lists a zone twice; give each zone once")
        return zones

    def to_request(self, template: MachineTemplate) -> MachineRequest:
        return MachineRequest(
            request_id=self.request_id,
            machine_name=self.machine_name,
            template=template,
            zones=tuple(self.zones),
            tags=self.tags,
            skip_batching=self.skip_batching,
        )


class MachinesBody(BaseModel):
    """``{"requests": [...]}``; a bare request object is accepted as a list of one."""

    model_config = ConfigDict(extra="forbid")

    requests: list[MachineRequestBody] = Field(min_length=1, max_length=MAX_REQUESTS_PER_CALL)

    @model_validator(mode="before")
    @classmethod
    def _one_or_many(cls, data: Any) -> Any:
        if isinstance(data, dict) and "requests" not in data:
            return {"requests": [data]}
        return data


class AcceptedResponse(BaseModel):
    """The requests are in the log; follow each at its status URL."""

    request_ids: list[str]
    status_urls: list[str]


class OutcomeError(BaseModel):
    code: str
    message: str
    retryable: bool
    retry_after_seconds: float | None


class OutcomeResponse(BaseModel):
    status: Literal["created", "failed"]
    provider_id: str | None
    at: str | None
    error: OutcomeError | None


class MachineStatusResponse(BaseModel):
    """Where a request is: pending → sealed → dispatched → created | failed."""

    request_id: str
    machine_name: str
    status: Literal["pending", "sealed", "dispatched", "created", "failed"]
    batch_id: str
    template_hash: str
    skip_batching: bool
    requested_at: str | None
    sealed_at: str | None
    seal_reason: str | None
    dispatched_at: str | None
    attempts: int
    outcome: OutcomeResponse | None
