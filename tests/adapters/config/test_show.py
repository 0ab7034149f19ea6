"""``fleetledger config show``: the effective configuration, secrets redacted; the example
file validates, lists every key, and round-trips through ``config show``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetledger.adapters.cli import EXIT_USAGE, main
from fleetledger.adapters.config import REDACTED, load_settings
from fleetledger.adapters.config.loading import keys

from .conftest import WriteToml

EXAMPLE = Path(__file__).parents[3] / "ops" / "fleetledger.example.toml"

PASSWORD = "pa55-word-in-url"
API_TOKEN = "api-token-0123456789abcdef"
EXTENDER_TOKEN = "extender-token-0123456789abcdef"
AUDIT_KEY = "audit-key-0123456789abcdef0123456789"

SECRETS = f"""
[database]
url = "postgresql://fleet:{PASSWORD}@db.internal:5432/fleet?sslmode=require&password={PASSWORD}"

[serve]
api_tokens = ["{API_TOKEN}"]

[serve.extender]
tokens = ["{EXTENDER_TOKEN}"]

[anchoring]
audit_key = "{AUDIT_KEY}"
"""


def shown(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


class TestSecrets:
    @pytest.mark.parametrize("output", [[], ["--json"]], ids=["toml", "json"])
    def test_no_secret_is_printed(
        self, write_toml: WriteToml, output: list[str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The URL's password, the tokens and the audit key are replaced; the rest of the URL
        stays, so that one can tell which database."""
        text = shown(["--config", str(write_toml(SECRETS)), "config", "show", *output], capsys)

        for secret in (PASSWORD, API_TOKEN, EXTENDER_TOKEN, AUDIT_KEY):
            assert secret not in text
        assert text.count(REDACTED) == 5
        assert f"postgresql://fleet:{REDACTED}@db.internal:5432/fleet?sslmode=require" in text

    def test_secrets_from_the_environment_are_redacted_too(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setenv("FLEETLEDGER_API_TOKENS", API_TOKEN)

        settings = json.loads(shown(["config", "show", "--json"], capsys))

        assert settings["serve"]["api_tokens"] == [REDACTED]


class TestShow:
    def test_the_json_is_the_effective_configuration(
        self,
        write_toml: WriteToml,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Flag over variable over file over default, as every command sees it."""
        monkeypatch.setenv("FLEETLEDGER_LOG_LEVEL", "debug")
        path = write_toml("[log]\nlevel = 'error'\njson = true\n[testbeds]\nnamespace = 'jobs'\n")

        settings = json.loads(
            shown(["--config", str(path), "--log-level", "warning", "config", "show", "--json"],
                  capsys)
        )  # fmt: skip

        assert settings["log"] == {"level": "warning", "json": True}
        assert settings["testbeds"]["namespace"] == "jobs"
        assert settings["serve"]["port"] == 8080

    def test_a_bad_file_is_a_usage_error_naming_each_key(
        self, write_toml: WriteToml, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = write_toml("[serve]\nport = 'http'\n[leadership]\nlease_seconds = inf\n")

        code = main(["--config", str(path), "config", "show"])

        lines = capsys.readouterr().err.splitlines()
        assert code == EXIT_USAGE
        assert lines == [
            f"fleetledger: error: config file {path}: serve.port is refused: 'http' is not a "
            "port number",
            f"fleetledger: error: config file {path}: leadership.lease_seconds must be a number "
            "of seconds from 1 to 3600, not 'inf' (not a finite number)",
        ]

    def test_a_bad_file_stops_every_command_before_it_runs(
        self, write_toml: WriteToml, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Validated once, up front: not only serve refuses it."""
        path = write_toml("[testbeds]\nnamespace = 'Bad_Name'\n")

        code = main(["--config", str(path), "db", "current"])

        assert code == EXIT_USAGE
        assert "testbeds.namespace must be a Kubernetes namespace name" in capsys.readouterr().err


class TestExample:
    def test_the_example_validates_with_pools_and_subnets(self) -> None:
        settings = load_settings(environ={}, config_file=EXAMPLE)

        assert [p.spec() for p in settings.pools] == [
            "general=Standard_D4s_v5:4000:16:binpack",
            "batch=Standard_D8s_v5:8000:32:spread",
        ]
        assert [s.spec() for s in settings.subnets] == ["aks-pods=1024"]

    def test_the_example_lists_every_key(self) -> None:
        """Each key appears, set or commented out, under its own section's header."""
        text = EXAMPLE.read_text(encoding="utf-8")
        missing = []
        for key in keys():
            *section, name = key.dotted.split(".")
            header = f"[{'.'.join(section)}]" if section else None
            start = text.index(header + "\n") if header else 0
            end = text.find("\n[", start + 1)
            body = text[start : end if end != -1 else len(text)]
            if not section:
                body = text  # a list of tables: [[pools]], [[subnets]]
            if re.search(rf"^(# )?{name} =|^\[\[{name}\]\]", body, re.MULTILINE) is None:
                missing.append(key.dotted)
        assert missing == []

    def test_config_show_of_the_example_round_trips(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The TOML `config show` prints loads back to the same settings."""
        printed = shown(["--config", str(EXAMPLE), "config", "show"], capsys)
        again = tmp_path / "shown.toml"
        again.write_text(printed, encoding="utf-8")

        assert load_settings(environ={}, config_file=again) == load_settings(
            environ={}, config_file=EXAMPLE
        )
        assert shown(["--config", str(again), "config", "show"], capsys) == printed
