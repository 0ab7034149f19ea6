"""One configuration for every command: flags > ``FLEETLEDGER_*`` environment > a TOML file
(``--config FILE``) > defaults, validated once as one model.

- :mod:`.model`: the sections and their rules (pydantic-settings), the only defaults.
- :mod:`.loading`: reading the environment and the file, merging, refusals naming their key.
- :mod:`.arguments`: which flag sets which key; the parsed arguments a command runs with.
- :mod:`.show`: the effective configuration, secrets redacted (``fleetledger config show``).

The event store keeps its own ``FLEETLEDGER_DATABASE_URL`` fallback for library users
(``fleetledger.eventstore.open_store(None)``); on the command line the URL is resolved here
first, so a flag, the variable and the file's ``database.url`` apply in that order.
"""

from fleetledger.adapters.config.arguments import (
    apply_settings,
    command_arguments,
    defer_defaults,
    settings_for,
)
from fleetledger.adapters.config.loading import CONFIG_FILE_ENV, ConfigError, load_settings
from fleetledger.adapters.config.model import Settings
from fleetledger.adapters.config.show import REDACTED, as_json, as_toml, redacted

__all__ = [
    "CONFIG_FILE_ENV",
    "REDACTED",
    "ConfigError",
    "Settings",
    "apply_settings",
    "as_json",
    "as_toml",
    "command_arguments",
    "defer_defaults",
    "load_settings",
    "redacted",
    "settings_for",
]
