"""Fixtures of the configuration's tests: an environment without FLEETLEDGER_* settings, and
TOML files written on the fly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fleetledger.adapters.config.loading import CONFIG_FILE_ENV, keys

WriteToml = Callable[[str], Path]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting leaks in from the environment the tests run in (a CI's database URL)."""
    for key in keys():
        monkeypatch.delenv(key.environment, raising=False)
    monkeypatch.delenv(CONFIG_FILE_ENV, raising=False)


@pytest.fixture
def write_toml(tmp_path: Path) -> WriteToml:
    """Writes its text to a new ``fleet-N.toml`` and returns the path."""
    written: list[Path] = []

    def write(text: str) -> Path:
        path = tmp_path / f"fleet-{len(written)}.toml"
        path.write_text(text, encoding="utf-8")
        written.append(path)
        return path

    return write
