"""The effective configuration as a person or a script reads it (``fleetledger config show``):
TOML in the file's own layout, or JSON; secrets redacted.

Redacted: the database URL's password (in its authority or as a ``password=`` parameter), the
API's and the extender's bearer tokens, and the audit (HMAC) key — each replaced by
:data:`REDACTED`, so that the output can be pasted into a ticket. What is not secret prints as
it is, so that the TOML of a configuration without secrets loads back to the same settings.
Unset keys print as comments, so that every key is listed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fleetledger.adapters.config.model import REDACTED, Settings

__all__ = ["REDACTED", "as_json", "as_toml", "redacted"]

_URL_PASSWORD = re.compile(r"(?<=://)([^:/@?#]*):[^@/]*@")
_PARAMETER_PASSWORD = re.compile(r"(?<=[?&]password=)[^&#]*", re.IGNORECASE)


def redacted(settings: Settings) -> dict[str, Any]:
    """The settings as plain data (the file's key names), secrets replaced by REDACTED."""
    data = settings.model_dump(mode="json", by_alias=True)
    url = data["database"]["url"]
    if url is not None:
        url = _URL_PASSWORD.sub(rf"\1:{REDACTED}@", url)
        data["database"]["url"] = _PARAMETER_PASSWORD.sub(REDACTED, url)
    serve = data["serve"]
    serve["api_tokens"] = [REDACTED for _ in serve["api_tokens"]]
    serve["extender"]["tokens"] = [REDACTED for _ in serve["extender"]["tokens"]]
    if data["anchoring"]["audit_key"] is not None:
        data["anchoring"]["audit_key"] = REDACTED
    return data


def as_json(settings: Settings) -> str:
    return json.dumps(redacted(settings), indent=2)


def as_toml(settings: Settings) -> str:
    """The redacted settings as a TOML document ``--config`` takes."""
    lines: list[str] = []
    _table(lines, [], redacted(settings))
    return "\n".join(lines).strip() + "\n"


def _table(lines: list[str], path: list[str], table: dict[str, Any]) -> None:
    # TOML puts a table's own keys under its header, before any sub-table's header.
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and not _tables(v)}
    if path and (scalars or not any(isinstance(v, dict) for v in table.values())):
        lines.extend(["", f"[{'.'.join(path)}]"])
    for key, value in scalars.items():
        lines.append(f"# {key}: not set" if value is None else f"{key} = {_value(value)}")
    for key, value in table.items():
        if isinstance(value, dict):
            _table(lines, [*path, key], value)
    for key, value in table.items():
        if _tables(value):
            for item in value:
                lines.extend(["", f"[[{'.'.join([*path, key])}]]"])
                lines.extend(f"{k} = {_value(v)}" for k, v in item.items() if v is not None)


def _tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # JSON's string escapes are a subset of TOML's basic strings'.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")
