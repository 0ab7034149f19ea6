"""The HTTP API's bodies: pydantic models, validated once at the edge.

``POST /v1/machines`` takes ``{"requests": [<request>, …]}`` or a single ``<request>`` object
(wrapped into a list of one before validation, so errors always point into ``requests``). The models
forbid unknown fields — a typo in a template field would otherwise split batches silently (the same
reason :meth:`fleetledger.domain.template.MachineTemplate.from_data` refuses unknown keys).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from fleetledger.adapters.machines import MachineRequest
from fleetledger.domain.template import MachineTemplate

__all__ = [
    "AcceptedResponse",
    "MachineRequestBody",
    "MachineStatusResponse",
    "MachinesBody",
    "OutcomeError",
    "OutcomeResponse",
    "TemplateBody",
]

MAX_REQUESTS_PER_CALL = 1000
_Name = Annotated[str, Field(min_length=1, max_length=128)]


class TemplateBody(BaseModel):
    """The shared machine template (PRODUCT.md §4.1); every field enters the template hash."""

    model_config = ConfigDict(extra="forbid")

    vm_size: str = Field(min_length=1, examples=["Standard_D4s_v5"])
    priority: Literal["spot", "regular"] = "regular"
    mode: str = Field(default="User", min_length=1)
    gpu_profile: str | None = None
    orchestrator_version: str | None = Field(default=None, examples=["1.31.2"])
    max_pods: StrictInt | None = Field(default=None, gt=0)
    kubelet_config: dict[str, str] = Field(default_factory=dict)
    os_sku: str | None = None
    os_disk_size_gb: StrictInt | None = Field(default=None, gt=0)
    os_disk_type: str | None = None
    enable_fips: StrictBool = False
    vnet_subnet_id: str | None = None

    def to_template(self) -> MachineTemplate:
        """The domain template (raises ``domain.errors.InvalidCommand`` on a value it refuses)."""
        values = self.model_dump()
        values["kubelet_config"] = tuple(sorted(self.kubelet_config.items()))
        return MachineTemplate(**values)


class MachineRequestBody(BaseModel):
    """One machine: the template plus its per-machine variations (name, zones, tags)."""

    model_config = ConfigDict(extra="forbid")

    request_id: _Name | None = Field(
        default=None,
        description="Idempotency key: re-sending a request with the same id and content "
        "changes nothing. Omitted: the server picks one.",
    )
    machine_name: _Name
    template: TemplateBody
    zones: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    tags: dict[Annotated[str, Field(min_length=1)], str] = Field(default_factory=dict)
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
