"""The one configuration model: every setting a command reads, in sections, validated once.

Each value is checked by the same rules the command line applies to the equivalent flag (the
``Number`` and ``Text`` types of :mod:`fleetledger.adapters.cli.options`), so a file and a flag
refuse the same values with the same words. A refusal is :func:`invalid`'s
``PydanticCustomError``, whose message is a predicate ("must be a number of seconds from 1 to
3600, not 'inf'"): :mod:`fleetledger.adapters.config.loading` puts the key or the flag and where
its value came from in front of it.

The defaults here are the only ones: ``serve``'s flags default to ``None`` (see
:func:`fleetledger.adapters.config.arguments.defer_defaults`), so that a flag left out never
masks the environment or the file.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from fleetledger.adapters.cli.options import (
    Number,
    Text,
    bounded_int,
    count,
    database_url,
    finite_float,
    name,
    port_number,
    seconds,
)
from fleetledger.adapters.cli.options import max_body_bytes as body_limit
from fleetledger.adapters.cli.serve_shards import shard_spec

__all__ = [
    "ENVIRONMENT_NAMES",
    "REDACTED",
    "SECRET_KEYS",
    "AnchoringSettings",
    "AzureProfile",
    "BatchingSettings",
    "CloudSettings",
    "DatabaseSettings",
    "ExtenderSettings",
    "IpamSettings",
    "LeadershipSettings",
    "LogSettings",
    "NodesSettings",
    "PlacementSettings",
    "PoolSettings",
    "ServeSettings",
    "Settings",
    "SubnetSettings",
    "TestbedsSettings",
    "invalid",
]

ENVIRONMENT_NAMES: dict[str, str] = {
    "log.level": "FLEETLEDGER_LOG_LEVEL",
    "log.json": "FLEETLEDGER_LOG_JSON",
    "serve.api_tokens": "FLEETLEDGER_API_TOKENS",
    "serve.extender.tokens": "FLEETLEDGER_EXTENDER_TOKENS",
    "cloud.write_rate": "FLEETLEDGER_WRITE_RATE",
    "cloud.write_burst": "FLEETLEDGER_WRITE_BURST",
    "cloud.max_concurrent_batches": "FLEETLEDGER_MAX_CONCURRENT_BATCHES",
    "cloud.azure.subscription_id": "FLEETLEDGER_AZURE_SUBSCRIPTION_ID",
    "cloud.azure.resource_group": "FLEETLEDGER_AZURE_RESOURCE_GROUP",
    "cloud.azure.location": "FLEETLEDGER_AZURE_LOCATION",
    "cloud.azure.image_id": "FLEETLEDGER_AZURE_IMAGE_ID",
    "cloud.azure.ssh_public_key": "FLEETLEDGER_AZURE_SSH_PUBLIC_KEY",
    "cloud.azure.subnet_id": "FLEETLEDGER_AZURE_SUBNET_ID",
    "cloud.azure.arm_endpoint": "FLEETLEDGER_AZURE_ARM_ENDPOINT",
    "cloud.azure.credential_scope": "FLEETLEDGER_AZURE_CREDENTIAL_SCOPE",
    "cloud.azure.aks_cluster": "FLEETLEDGER_AKS_CLUSTER",
    "cloud.azure.aks_agent_pool": "FLEETLEDGER_AKS_AGENT_POOL",
    "anchoring.audit_key": "FLEETLEDGER_AUDIT_KEY",
}
"""The keys whose environment variable predates this model and keeps its name; every other key
``a.b_c`` is read from ``FLEETLEDGER_A_B_C``."""


REDACTED = "<redacted>"
"""What a secret is shown as."""

SECRET_KEYS = ("database.url", "serve.api_tokens", "serve.extender.tokens", "anchoring.audit_key")
"""The keys whose values are secret (a URL may hold a password): never shown, not even in a
refusal."""


def invalid(message: str) -> PydanticCustomError:
    """A refusal whose message is shown as it is (pydantic would prefix a ``ValueError``'s)."""
    return PydanticCustomError("fleetledger", "{message}", {"message": message})


def _parsed_by(parse: Callable[[str], Any]) -> BeforeValidator:
    """Check a value with one of the command line's argument types, which take text: a number
    from a TOML file is checked as its text, so ``inf`` or ``4000.5`` are refused alike."""
    return BeforeValidator(_checked(parse))


def _checked(parse: Callable[[str], Any]) -> Callable[[object], Any]:
    def check(value: object) -> Any:
        textual = isinstance(parse, Text) or parse is database_url
        if isinstance(value, bool) or not isinstance(value, str if textual else int | float | str):
            raise invalid(f"must be {_expected(parse)}, not {value!r}")
        try:
            return parse(str(value))
        except argparse.ArgumentTypeError as e:
            message = str(e)
            raise invalid(message if parse is not port_number else f"is refused: {message}") from e

    return check


def _expected(parse: Callable[[str], Any]) -> str:
    if isinstance(parse, Number):
        return parse.describe()
    if parse is port_number:
        return "a port number from 0 to 65535"
    return "a string"


Name = Annotated[str, _parsed_by(name)]
Seconds = Annotated[float, _parsed_by(seconds(at_most=3600))]
LeaseSeconds = Annotated[float, _parsed_by(seconds(at_least=1, at_most=3600))]
GraceSeconds = Annotated[float, _parsed_by(seconds(at_least=0, at_most=3600))]
Count = Annotated[int, _parsed_by(count())]
Port = Annotated[int, _parsed_by(port_number)]


def _path(value: object) -> object:
    # argparse hands Path objects for the file flags; the model keeps the text.
    return str(value) if hasattr(value, "__fspath__") else value


FileName = Annotated[str, BeforeValidator(_path), _parsed_by(name)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _token_list(noun: str) -> BeforeValidator:
    """Bearer tokens, each checked as the API checks them (length, characters), so a bad one is
    refused at start-up under its key rather than at the first request."""

    def check(value: object) -> object:
        if not isinstance(value, list):
            return value
        from fleetledger.adapters.http.auth import ApiTokens

        try:
            ApiTokens(value) if value else None
        except ValueError as e:
            raise invalid(f"has an unusable token: {str(e).replace('API token', noun)}") from e
        return value

    return BeforeValidator(check)


class DatabaseSettings(_Section):
    url: Annotated[str | None, _parsed_by(database_url)] = None
    """The event log's URL; ``None``: ``sqlite:///fleetledger.db`` (the store's own default)."""


def _log_level(value: object) -> object:
    if value is None:
        return None
    if isinstance(value, str) and logging.getLevelNamesMapping().get(value.upper()) is not None:
        return value.lower()
    raise invalid(f"must be debug, info, warning or error, not {value!r}")


class LogSettings(_Section):
    level: Annotated[str | None, BeforeValidator(_log_level)] = None
    """``None``: ``info``, or ``warning`` for the commands that print a report."""
    json_lines: bool | None = Field(default=None, alias="json")
    """JSON log lines; ``None``: when stderr is not a terminal."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ExtenderSettings(_Section):
    port: Port | None = None
    """Serve the kube-scheduler extender on this port too; ``None``: no extender."""
    host: Name | None = None
    tokens: Annotated[list[str], _token_list("extender token")] = []
    tls_cert: FileName | None = None
    tls_key: FileName | None = None


class ServeSettings(_Section):
    host: Name = "127.0.0.1"
    port: Port = 8080
    api_tokens: Annotated[list[str], _token_list("API token")] = []
    insecure_no_auth: bool = False
    grace_seconds: GraceSeconds = 30.0
    max_body_bytes: Annotated[int, _parsed_by(body_limit)] = 1024 * 1024
    cluster: Literal["fake", "kubernetes"] = "fake"
    extender: ExtenderSettings = ExtenderSettings()


class LeadershipSettings(_Section):
    kind: Literal["database", "kubernetes"] = "database"
    lease_seconds: LeaseSeconds = 10.0
    lease_name: Name | None = None
    lease_namespace: Name | None = None


def _shard(value: object) -> object:
    # Text only: a TOML number (``shard = 0``) is no partition of a count.
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f'must be text PARTITION/COUNT, like "0/2", not {value!r}')
    try:
        return shard_spec(value)
    except argparse.ArgumentTypeError as e:
        raise invalid(str(e)) from e


class NodesSettings(_Section):
    """Node accounting."""

    shard: Annotated[str | None, BeforeValidator(_shard)] = None
    """``PARTITION/COUNT``: lead only that partition of the nodes, on a lease, term and fence
    of its own (``serve --nodes-shard``); ``None``: every node, on the process's lease."""


def _write_rate(value: object) -> object:
    # "none": no local write budget (the cloud's own throttling only), as the variable allows.
    if isinstance(value, str) and value.strip().lower() == "none":
        return "none"
    return _rate(value)


_rate = _checked(finite_float(minimum=0, maximum=1_000_000, minimum_excluded=True))


class AzureProfile(_Section):
    """The real clouds' settings (``--cloud azure-vm`` or ``aks``); credentials are never here:
    they come from ``DefaultAzureCredential``."""

    subscription_id: Name | None = None
    resource_group: Name | None = None
    location: Name | None = None
    image_id: Name | None = None
    ssh_public_key: Annotated[str | None, _parsed_by(Text(max_length=16384))] = None
    subnet_id: Name | None = None
    arm_endpoint: Name | None = None
    credential_scope: Name | None = None
    aks_cluster: Name | None = None
    aks_agent_pool: Name | None = None


class CloudSettings(_Section):
    kind: Literal["fake", "azure-vm", "aks"] = "fake"
    fake_latency: GraceSeconds = 2.0
    fake_cloud_file: FileName | None = None
    write_rate: Annotated[float | Literal["none"] | None, BeforeValidator(_write_rate)] = None
    write_burst: Count | None = None
    max_concurrent_batches: Count | None = None
    azure: AzureProfile = AzureProfile()


class BatchingSettings(_Section):
    grouper: Name = "default"
    idle_timeout: Seconds = 0.5
    max_timeout: Seconds = 5.0
    max_batch_size: Count = 50


class PlacementSettings(_Section):
    search_steps: Annotated[int | None, _parsed_by(count(minimum=0, maximum=1_000_000_000))] = None


_POOL_SPEC = "NAME=VM_SIZE:CPU_MILLI:MEMORY_GIB[:binpack|spread]"


class PoolSettings(_Section):
    """A worker pool placement may grow; written as a table, or as ``--pool``'s spec."""

    name: Name
    vm_size: Name
    cpu_milli: Count
    memory_gib: Annotated[int, _parsed_by(bounded_int(minimum=1, maximum=1 << 20))]
    strategy: Literal["binpack", "spread"] = "binpack"

    @model_validator(mode="before")
    @classmethod
    def _from_spec(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        pool, _, shape = value.partition("=")
        parts = shape.split(":")
        strategy = parts.pop() if len(parts) == 4 else "binpack"
        if not pool or len(parts) != 3 or strategy not in ("binpack", "spread"):
            raise invalid(
                f"takes {_POOL_SPEC}, e.g. general=Standard_D4s_v5:4000:16 or "
                f"batch=Standard_D4s_v5:4000:16:spread, not {value!r}"
            )
        keys = ("vm_size", "cpu_milli", "memory_gib")
        return {"name": pool, **dict(zip(keys, parts, strict=True)), "strategy": strategy}

    def spec(self) -> str:
        """The pool as ``--pool`` takes it."""
        return f"{self.name}={self.vm_size}:{self.cpu_milli}:{self.memory_gib}:{self.strategy}"


class SubnetSettings(_Section):
    """A subnet whose pod IPs are managed; written as a table, or as ``--subnet``'s spec."""

    id: Name
    capacity: Annotated[int, _parsed_by(bounded_int(minimum=1, maximum=1 << 32))]

    @model_validator(mode="before")
    @classmethod
    def _from_spec(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        subnet, _, capacity = value.partition("=")
        if not subnet or not capacity:
            raise invalid(f"takes ID=CAPACITY with a positive capacity, not {value!r}")
        return {"id": subnet, "capacity": capacity}

    def spec(self) -> str:
        return f"{self.id}={self.capacity}"


class IpamSettings(_Section):
    """The pod-IP batch's factors (seed 03; ``None`` keeps the domain's default), and the shard
    of the subnets this process leads."""

    max_ips: Annotated[int | None, _parsed_by(count(maximum=250))] = None
    x_nsf: Annotated[float | None, _parsed_by(finite_float(minimum=1, maximum=1000))] = None
    x_ssf: Annotated[
        float | None, _parsed_by(finite_float(minimum=0, maximum=1, minimum_excluded=True))
    ] = None
    shard: Annotated[str | None, BeforeValidator(_shard)] = None
    """``PARTITION/COUNT``: make the allocator calls of only that partition of the subnets, on
    a lease, term and fence of its own (``serve --ipam-shard``); ``None``: every subnet's, on
    the process's lease."""


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _namespace(value: object) -> object:
    if not isinstance(value, str) or _DNS_LABEL.match(value) is None:
        raise invalid(
            "must be a Kubernetes namespace name (lower-case letters, digits and '-', at most "
            f"63), not {value!r}"
        )
    return value


class TestbedsSettings(_Section):
    namespace: Annotated[str, BeforeValidator(_namespace)] = "default"


class AnchoringSettings(_Section):
    """Signed anchors of the log's head, kept by the leader (``audit verify --anchor``)."""

    file: FileName | None = None
    every_seconds: Annotated[float, _parsed_by(seconds(at_most=365 * 24 * 3600))] = 300.0
    key_file: FileName | None = None
    ed25519_key: FileName | None = None
    audit_key: SecretStr | None = None
    """The HMAC key itself (at least 32 bytes), when no key file is given."""

    @model_validator(mode="after")
    def _one_key(self) -> AnchoringSettings:
        if self.key_file is not None and self.ed25519_key is not None:
            raise invalid(
                "sets both key_file and ed25519_key: anchors are signed with one key, keep one"
            )
        return self

    @field_validator("audit_key")
    @classmethod
    def _long_enough(cls, key: SecretStr | None) -> SecretStr | None:
        from fleetledger.eventstore.anchors import MIN_HMAC_KEY_BYTES

        if key is not None and len(key.get_secret_value().encode()) < MIN_HMAC_KEY_BYTES:
            # The key itself is never shown, as everywhere else.
            raise invalid(
                f"must be at least {MIN_HMAC_KEY_BYTES} bytes (e.g. `openssl rand -hex 32`)"
            )
        return key


class Settings(BaseSettings):
    """Everything a ``fleetledger`` command is configured with. Build it with
    :func:`fleetledger.adapters.config.loading.load_settings` (flags, environment, file)."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True)

    database: DatabaseSettings = DatabaseSettings()
    log: LogSettings = LogSettings()
    serve: ServeSettings = ServeSettings()
    leadership: LeadershipSettings = LeadershipSettings()
    nodes: NodesSettings = NodesSettings()
    cloud: CloudSettings = CloudSettings()
    batching: BatchingSettings = BatchingSettings()
    placement: PlacementSettings = PlacementSettings()
    pools: list[PoolSettings] = []
    subnets: list[SubnetSettings] = []
    ipam: IpamSettings = IpamSettings()
    testbeds: TestbedsSettings = TestbedsSettings()
    anchoring: AnchoringSettings = AnchoringSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # pydantic-settings' own environment reader would take any variable named like a
        # section (``SERVE``, ``LOG``): the layers below the first are the loader's
        # (environment and file, see loading.py), each a dict shaped like the model.
        return (init_settings, *(_Layer(settings_cls, layer) for layer in _LOWER_LAYERS.get()))

    @classmethod
    def from_layers(cls, *layers: Mapping[str, Any]) -> Settings:
        """The settings from ``layers``, the highest precedence first, merged key by key by
        pydantic-settings (a table given in two layers keeps the lower one's other keys; a
        list is replaced whole); ``ValidationError`` for any value refused."""
        first, *lower = layers or ({},)
        token = _LOWER_LAYERS.set(tuple(lower))
        try:
            return cls(**first)
        finally:
            _LOWER_LAYERS.reset(token)


_LOWER_LAYERS: ContextVar[tuple[Mapping[str, Any], ...]] = ContextVar(
    "fleetledger_config_layers", default=()
)
"""The layers below the first while :meth:`Settings.from_layers` builds (the sources' hook is a
class method: it has no other way to receive them)."""


class _Layer(PydanticBaseSettingsSource):
    """One layer of already-read values, shaped like the model."""

    def __init__(self, settings_cls: type[BaseSettings], values: Mapping[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)
