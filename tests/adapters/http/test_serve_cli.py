"""``fleetledger serve``: refuses what it cannot serve (a real cloud without settings, a bad or
taken port) before starting anything."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from fleetledger.adapters.cli import EXIT_ERROR, EXIT_TAMPERED, EXIT_USAGE, main, serve

AZURE_VARIABLES = (
    "FLEETLEDGER_AZURE_SUBSCRIPTION_ID",
    "FLEETLEDGER_AZURE_RESOURCE_GROUP",
    "FLEETLEDGER_AZURE_LOCATION",
    "FLEETLEDGER_AZURE_IMAGE_ID",
    "FLEETLEDGER_AZURE_SSH_PUBLIC_KEY",
)


class TestServe:
    def test_an_unconfigured_azure_cloud_is_a_usage_error_naming_the_settings(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The message lists the environment variables to set, and nothing is started."""
        for name in AZURE_VARIABLES:
            monkeypatch.delenv(name, raising=False)

        code = main(["serve", "--cloud", "azure-vm"])

        error = capsys.readouterr().err
        assert code == EXIT_USAGE
        assert all(name in error for name in AZURE_VARIABLES)
        assert "--cloud fake" in error

    def test_an_invalid_grouper_timing_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Configuration is validated before anything opens, with the domain's advice."""
        code = main(["serve", "--idle-timeout", "10", "--max-timeout", "1"])

        assert code == EXIT_USAGE
        assert "idle_timeout" in capsys.readouterr().err


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another socket is listening on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


class TestPort:
    def test_a_port_out_of_range_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`--port 99999` is refused by the argument parser, not by a traceback later."""
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--port", "99999"])

        assert exit_.value.code == EXIT_USAGE
        assert "outside 0-65535" in capsys.readouterr().err

    def test_a_taken_port_fails_before_the_log_is_opened(
        self,
        sqlite_url: str,
        taken_port: int,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A port in use exits 1 (never 3, which means tampered) with one line, and the store
        and so the runtime are never started."""
        opened: list[Any] = []
        monkeypatch.setattr(serve, "open_store", lambda *a, **k: opened.append(a))

        code = main(["serve", "--url", sqlite_url, "--port", str(taken_port)])

        err = capsys.readouterr().err.strip()
        assert code == EXIT_ERROR and code != EXIT_TAMPERED
        assert f"cannot listen on 127.0.0.1:{taken_port}" in err and len(err.splitlines()) == 1
        assert opened == []
