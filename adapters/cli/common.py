"""What the commands' handlers share: the exit statuses, JSON output, and the refusal of a
SQLite database that does not exist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_TAMPERED",
    "EXIT_USAGE",
    "print_json",
    "require_database",
]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TAMPERED = 3
EXIT_INTERRUPTED = 130


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def require_database(url: str) -> None:
    """Refuse a SQLite file that does not exist: opening it would create an empty database."""
    from fleetledger.eventstore._engine import normalise_url

    parsed = normalise_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    if parsed.database.startswith("file:") or Path(parsed.database).exists():
        return
    from fleetledger.eventstore import StoreUnavailable

    raise StoreUnavailable(
        f"the database {parsed.database!r} does not exist; check --url, or create it with: "
        f"fleetledger db upgrade --url '{url}'"
    )
