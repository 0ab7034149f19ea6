"""The bridge between argparse and the configuration: which flag sets which key, and the parsed
arguments a command runs with once every key is resolved.

argparse fills a flag left out with its default, which would be indistinguishable from the
same value given, and would mask the environment and the file. So the flags listed here default
to ``None`` (:func:`defer_defaults`; a repeatable flag keeps ``[]``, which no one can give), the
model holds the defaults, and a flag counts as given when its value is not ``None`` (nor
``[]``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetledger.adapters.config.loading import environment_name, load_settings
from fleetledger.adapters.config.model import AzureProfile, Settings

__all__ = [
    "COMMAND_FLAGS",
    "GLOBAL_FLAGS",
    "adapter_environment",
    "apply_settings",
    "command_arguments",
    "defer_defaults",
    "given_flags",
    "settings_for",
]

GLOBAL_FLAGS: dict[str, str] = {
    "url": "database.url",
    "log_level": "log.level",
    "log_json": "log.json",
}
"""argparse destination → key, for the flags of every command (``--url`` where it exists)."""

COMMAND_FLAGS: dict[str, dict[str, str]] = {
    "serve": {
        "host": "serve.host",
        "port": "serve.port",
        "api_token": "serve.api_tokens",
        "insecure_no_auth": "serve.insecure_no_auth",
        "grace_seconds": "serve.grace_seconds",
        "max_body_bytes": "serve.max_body_bytes",
        "cluster": "serve.cluster",
        "extender_port": "serve.extender.port",
        "extender_host": "serve.extender.host",
        "extender_token": "serve.extender.tokens",
        "extender_tls_cert": "serve.extender.tls_cert",
        "extender_tls_key": "serve.extender.tls_key",
        "leader_election": "leadership.kind",
        "lease_seconds": "leadership.lease_seconds",
        "lease_name": "leadership.lease_name",
        "lease_namespace": "leadership.lease_namespace",
        "nodes_shard": "nodes.shard",
        "cloud": "cloud.kind",
        "fake_latency": "cloud.fake_latency",
        "fake_cloud_file": "cloud.fake_cloud_file",
        "write_rate": "cloud.write_rate",
        "write_burst": "cloud.write_burst",
        "max_concurrent_batches": "cloud.max_concurrent_batches",
        "grouper": "batching.grouper",
        "idle_timeout": "batching.idle_timeout",
        "max_timeout": "batching.max_timeout",
        "max_batch_size": "batching.max_batch_size",
        "placement_search_steps": "placement.search_steps",
        "pool": "pools",
        "subnet": "subnets",
        "ipam_max_ips": "ipam.max_ips",
        "ipam_x_nsf": "ipam.x_nsf",
        "ipam_x_ssf": "ipam.x_ssf",
        "ipam_shard": "ipam.shard",
        "testbeds_namespace": "testbeds.namespace",
        "anchor_file": "anchoring.file",
        "anchor_every": "anchoring.every_seconds",
        "key_file": "anchoring.key_file",
        "ed25519_key": "anchoring.ed25519_key",
    },
}
"""Per command: argparse destination → key."""

_PATHS = frozenset({"anchor_file", "key_file", "ed25519_key"})
"""Destinations argparse hands as ``Path`` (``type=Path``)."""


def defer_defaults(parser: argparse.ArgumentParser, command: str) -> None:
    """Make ``command``'s configurable flags default to ``None``, so that one left out lets
    the environment, the file or the model's default decide (see the module's docstring)."""
    configurable = COMMAND_FLAGS[command]
    defaults = Settings()
    for action in parser._actions:
        key = configurable.get(action.dest)
        if key is None or isinstance(action.default, list):
            continue
        default = _value(defaults, key)
        if action.default is not None and action.default != default:
            # Two defaults would drift apart silently: the model's is the one that applies.
            raise ValueError(
                f"{command} {action.option_strings[-1]} defaults to {action.default!r} but "
                f"{key} to {default!r}; keep the default in the configuration model only"
            )
        action.default = None
        if action.help and "default" not in action.help and default not in (None, False):
            action.help += f" (default: {str(default).replace('%', '%%')})"


def given_flags(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """The configurable flags given on the command line: key → (flag, value)."""
    table = {**GLOBAL_FLAGS, **COMMAND_FLAGS.get(getattr(args, "command", None) or "", {})}
    given: dict[str, tuple[str, Any]] = {}
    for dest, key in table.items():
        value = getattr(args, dest, None)
        if value is None or value == []:
            continue
        if isinstance(value, os.PathLike):
            value = os.fspath(value)  # ``type=Path`` flags: the model holds file names as text
        given[key] = ("--" + dest.replace("_", "-"), value)
    return given


def settings_for(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """The settings a command runs with: its flags given, the environment, ``--config``'s
    file; ``ConfigError`` naming what to fix."""
    return load_settings(
        flags=given_flags(args), environ=environ, config_file=getattr(args, "config", None)
    )


def apply_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve ``args`` in place: every configurable flag of its command (and ``--url``) set
    from the settings (:func:`settings_for`), as argparse would have parsed it, and
    ``args.environ``, the environment the adapters read (:func:`adapter_environment`). The
    command then runs on ``args`` alone; ``ConfigError`` says what to fix."""
    settings = settings_for(args, environ)
    _resolve(args, settings, os.environ if environ is None else environ)
    return settings


def command_arguments(
    args: argparse.Namespace, settings: Settings, environ: Mapping[str, str] | None = None
) -> argparse.Namespace:
    """A copy of ``args`` resolved from ``settings`` (as :func:`apply_settings` does)."""
    resolved = argparse.Namespace(**vars(args))
    _resolve(resolved, settings, os.environ if environ is None else environ)
    return resolved


def _resolve(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> None:
    table = {**GLOBAL_FLAGS, **COMMAND_FLAGS.get(getattr(args, "command", None) or "", {})}
    for dest, key in table.items():
        if hasattr(args, dest):
            setattr(args, dest, _as_parsed(dest, _value(settings, key)))
    args.environ = adapter_environment(settings, environ)


def _value(settings: Settings, dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, "json_lines" if part == "json" else part)
    return value


def _as_parsed(dest: str, value: Any) -> Any:
    if dest in ("pool", "subnet"):
        return [item.spec() for item in value]
    if dest in ("api_token", "extender_token"):
        return list(value) or None
    if dest == "write_rate" and value == "none":
        return None  # the adapters' environment carries "none" (no local write budget)
    if dest in _PATHS and value is not None:
        return Path(value)
    return value


_ADAPTER_KEYS = (
    "cloud.write_rate",
    "cloud.write_burst",
    "cloud.max_concurrent_batches",
    *(f"cloud.azure.{name}" for name in AzureProfile.model_fields),
    "anchoring.audit_key",
)
"""The keys the adapters read from the environment themselves (the cloud's profile and write
budget, the audit key): they are handed the resolved values under the same names."""


def adapter_environment(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the adapters' keys set from ``settings`` (which already read them from
    ``environ``, so only the file's values are new)."""
    merged = dict(environ)
    for key in _ADAPTER_KEYS:
        value = _value(settings, key)
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        merged[environment_name(key)] = str(value)
    return merged
