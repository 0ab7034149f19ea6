"""Building the configuration from its layers: flags > ``FLEETLEDGER_*`` environment > a TOML
file (``--config FILE``, else ``$FLEETLEDGER_CONFIG``) > the model's defaults.

Each layer is read here into a dict shaped like the model and handed to pydantic-settings,
which merges them key by key (:meth:`Settings.from_layers`). Reading them here, rather than
through pydantic-settings' own readers, keeps where each value came from: a refusal says the
flag, the variable or the file and key, then what the value must be —
``config file fleet.toml: leadership.lease_seconds must be a number of seconds from 1 to 3600,
not 'inf' (not a finite number)``.

The environment: every key ``section.name`` is read from ``FLEETLEDGER_SECTION_NAME``, except
the variables that predate the file and keep their names (:data:`ENVIRONMENT_NAMES`, e.g.
``FLEETLEDGER_DATABASE_URL``, ``FLEETLEDGER_API_TOKENS``); a list (tokens, pools, subnets) is
comma-separated, each pool or subnet as its flag takes it. An empty variable counts as unset.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from fleetledger.adapters.config.model import ENVIRONMENT_NAMES, REDACTED, SECRET_KEYS, Settings

__all__ = [
    "CONFIG_FILE_ENV",
    "ConfigError",
    "Key",
    "environment_name",
    "keys",
    "load_settings",
]

CONFIG_FILE_ENV = "FLEETLEDGER_CONFIG"
"""The config file's path when ``--config`` is not given."""


class ConfigError(ValueError):
    """A setting refused, or the file unreadable: the message names the flag, the variable or
    the file and key, and says what the value must be, one line per value refused. The CLI
    exits 2 (bad usage) on it."""

    def report(self, prefix: str) -> str:
        """The message with ``prefix`` on each of its lines."""
        return "\n".join(prefix + line for line in str(self).splitlines())


@dataclass(frozen=True, slots=True)
class Key:
    """One setting: its dotted name, its environment variable, and whether it is a list."""

    dotted: str
    environment: str
    is_list: bool


def environment_name(dotted: str) -> str:
    """The variable ``dotted`` is read from."""
    return ENVIRONMENT_NAMES.get(dotted) or "FLEETLEDGER_" + dotted.replace(".", "_").upper()


def keys(model: type[BaseModel] = Settings, prefix: str = "") -> Iterator[Key]:
    """Every setting of ``model``, sections walked into (a list of tables is one key)."""
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{info.alias or name}"
        section = info.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            yield from keys(section, f"{dotted}.")
        else:
            yield Key(dotted, environment_name(dotted), isinstance(info.default, list))


@dataclass(frozen=True, slots=True)
class _Layer:
    """One layer's values (shaped like the model) and how to name a key's origin in it."""

    values: dict[str, Any]
    names: dict[str, str] = field(default_factory=dict)
    """Dotted key → the flag or variable it came from; empty for the file."""
    file: str | None = None

    def origin(self, loc: Sequence[str | int]) -> str | None:
        """Where the value at ``loc`` came from in this layer, or None if not from it."""
        path = [str(part) for part in loc if not isinstance(part, int)]
        if self.file is None:
            for end in range(len(path), 0, -1):
                name = self.names.get(".".join(path[:end]))
                if name is not None:
                    return name
            return None
        node: Any = self.values
        for index, part in enumerate(loc):
            if isinstance(node, str):
                break  # a spec (``--pool``'s form): the part refused is named by its field
            listed = isinstance(node, list) and isinstance(part, int) and part < len(node)
            if listed or (isinstance(node, dict) and part in node):
                node = node[part]
            elif isinstance(node, dict) and index == len(loc) - 1:
                break  # a required key missing from a table the file has
            else:
                return None
        return f"config file {self.file}: {_dotted(loc)}"


def load_settings(
    *,
    flags: Mapping[str, tuple[str, Any]] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """The settings: ``flags`` (dotted key → the flag's name and its value, only the flags
    given), then ``environ`` (default: the process's), then ``config_file`` (default:
    ``$FLEETLEDGER_CONFIG``, else none), then the defaults. ``ConfigError`` for any value
    refused, naming where it came from."""
    env = os.environ if environ is None else environ
    path = config_file if config_file is not None else (env.get(CONFIG_FILE_ENV) or None)
    layers = [
        _flag_layer(flags or {}),
        _environment_layer(env),
        _file_layer(Path(path)) if path is not None else _Layer({}),
    ]
    try:
        return Settings.from_layers(*(layer.values for layer in layers))
    except ValidationError as e:
        raise ConfigError(_explained(e, layers)) from None


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        *sections, last = dotted.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = value
    return nested


def _flag_layer(flags: Mapping[str, tuple[str, Any]]) -> _Layer:
    return _Layer(
        _nested({dotted: value for dotted, (_, value) in flags.items()}),
        {dotted: flag for dotted, (flag, _) in flags.items()},
    )


def _environment_layer(environ: Mapping[str, str]) -> _Layer:
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for key in keys():
        text = environ.get(key.environment, "")
        if not text.strip():
            continue
        values[key.dotted] = (
            [part.strip() for part in text.split(",") if part.strip()] if key.is_list else text
        )
        names[key.dotted] = f"environment variable {key.environment}"
    return _Layer(_nested(values), names)


def _file_layer(path: Path) -> _Layer:
    try:
        with path.open("rb") as file:
            values = tomllib.load(file)
    except OSError as e:
        raise ConfigError(
            f"cannot read the config file {str(path)!r}: {e.strerror or e}; check --config "
            f"(or ${CONFIG_FILE_ENV})"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    return _Layer(values, file=str(path))


def _explained(error: ValidationError, layers: Sequence[_Layer]) -> str:
    """One line per refused value: where it came from, then what it must be."""
    lines = []
    for problem in error.errors():
        loc = problem["loc"]
        where = next(
            (found for layer in layers if (found := layer.origin(loc)) is not None),
            f"setting {_dotted(loc)}",
        )
        secret = _dotted(loc).startswith(SECRET_KEYS) and problem["type"] != "fleetledger"
        shown = {**problem, "input": REDACTED} if secret else problem
        lines.append(f"{where} {_predicate(shown)}")
    return "\n".join(lines)


def _dotted(loc: Sequence[str | int]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _predicate(problem: Any) -> str:
    kind = problem["type"]
    if kind == "fleetledger":
        return str(problem["msg"])
    if kind == "extra_forbidden":
        return _unknown(problem["loc"])
    if kind == "missing":
        return "is required"
    if kind == "literal_error":
        return f"must be one of {problem['ctx']['expected']}, not {problem['input']!r}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false, not {problem['input']!r}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a table, not {problem['input']!r}"
    if kind == "list_type":
        return f"must be a list, not {problem['input']!r}"
    if kind == "string_type":
        return f"must be a string, not {problem['input']!r}"
    return f"is refused ({problem['msg']}), not {problem['input']!r}"


def _unknown(loc: Sequence[str | int]) -> str:
    """``is not a setting``, with the nearest known ones: the same name in another section
    first (``serve.lease_seconds`` is ``leadership.lease_seconds``), else a close spelling."""
    name = str(loc[-1])
    known = [key.dotted for key in keys()]
    elsewhere = [dotted for dotted in known if dotted.rsplit(".", 1)[-1] == name]
    siblings = _fields_at(loc[:-1])
    close = difflib.get_close_matches(name, siblings, n=1)
    if elsewhere:
        hint = f"; did you mean {' or '.join(elsewhere)}?"
    elif close:
        hint = f"; did you mean {close[0]}?"
    else:
        hint = f"; the settings here are: {', '.join(siblings)}" if siblings else ""
    return f"is not a setting{hint}"


def _fields_at(loc: Sequence[str | int]) -> list[str]:
    """The field names of the section (or list item) at ``loc``."""
    model: type[BaseModel] | None = Settings
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        info = next(
            (f for n, f in model.model_fields.items() if (f.alias or n) == part),
            None,
        )
        model = None if info is None else _model_in(info.annotation)
    if model is None:
        return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None
