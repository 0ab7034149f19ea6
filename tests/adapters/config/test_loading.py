"""Building the configuration: flags > FLEETLEDGER_* environment > the TOML file > defaults,
and refusals that name the key, where its value came from, and what it must be."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetledger.adapters.config import ConfigError, Settings, load_settings
from fleetledger.adapters.config.loading import environment_name, keys

from .conftest import WriteToml

FILE = """
[serve]
port = 9000
host = "0.0.0.0"

[leadership]
lease_seconds = 20

[[pools]]
name = "from-file"
vm_size = "Standard_D4s_v5"
cpu_milli = 4000
memory_gib = 16

[[subnets]]
id = "file-subnet"
capacity = 100
"""


class TestPrecedence:
    def test_the_defaults_apply_without_any_layer(self) -> None:
        """Nothing given: the model's defaults, which are serve's documented ones."""
        settings = load_settings(environ={})

        assert settings == Settings()
        assert (settings.serve.port, settings.leadership.lease_seconds) == (8080, 10.0)
        assert settings.pools == [] and settings.subnets == []

    def test_the_file_beats_the_defaults(self, write_toml: WriteToml) -> None:
        settings = load_settings(environ={}, config_file=write_toml(FILE))

        assert (settings.serve.port, settings.serve.host) == (9000, "0.0.0.0")
        assert settings.leadership.lease_seconds == 20.0
        assert [p.name for p in settings.pools] == ["from-file"]
        assert [(s.id, s.capacity) for s in settings.subnets] == [("file-subnet", 100)]
        # Keys the file leaves out keep their defaults.
        assert settings.serve.grace_seconds == 30.0

    def test_the_environment_beats_the_file(self, write_toml: WriteToml) -> None:
        """A variable replaces the file's key only (the table's other keys stay), and a list
        whole."""
        environ = {
            "FLEETLEDGER_SERVE_PORT": "9100",
            "FLEETLEDGER_POOLS": "env-a=Standard_D2s_v5:2000:8, "
            "env-b=Standard_D8s_v5:8000:32:spread",
            "FLEETLEDGER_SUBNETS": "env-subnet=512",
        }

        settings = load_settings(environ=environ, config_file=write_toml(FILE))

        assert (settings.serve.port, settings.serve.host) == (9100, "0.0.0.0")
        assert [(p.name, p.strategy) for p in settings.pools] == [
            ("env-a", "binpack"),
            ("env-b", "spread"),
        ]
        assert [s.spec() for s in settings.subnets] == ["env-subnet=512"]

    def test_a_flag_beats_the_environment(self, write_toml: WriteToml) -> None:
        environ = {
            "FLEETLEDGER_SERVE_PORT": "9100",
            "FLEETLEDGER_POOLS": "env-a=Standard_D2s_v5:2000:8",
            "FLEETLEDGER_SUBNETS": "env-subnet=512",
            "FLEETLEDGER_LEADERSHIP_LEASE_SECONDS": "30",
        }
        flags = {
            "serve.port": ("--port", 9200),
            "pools": ("--pool", ["flag-pool=Standard_D4s_v5:4000:16"]),
            "subnets": ("--subnet", ["flag-subnet=64"]),
        }

        settings = load_settings(flags=flags, environ=environ, config_file=write_toml(FILE))

        assert settings.serve.port == 9200
        assert [p.name for p in settings.pools] == ["flag-pool"]
        assert [s.id for s in settings.subnets] == ["flag-subnet"]
        # Not given as a flag: the environment's.
        assert settings.leadership.lease_seconds == 30.0

    def test_the_variables_that_predate_the_file_keep_their_names(self) -> None:
        environ = {
            "FLEETLEDGER_DATABASE_URL": "postgresql://db/fleet",
            "FLEETLEDGER_LOG_LEVEL": "WARNING",
            "FLEETLEDGER_API_TOKENS": "a" * 20 + ", " + "b" * 20,
            "FLEETLEDGER_EXTENDER_TOKENS": "c" * 20,
            "FLEETLEDGER_WRITE_RATE": "none",
            "FLEETLEDGER_AKS_CLUSTER": "fleet-aks",
        }

        settings = load_settings(environ=environ)

        assert settings.database.url == "postgresql://db/fleet"
        assert settings.log.level == "warning"
        assert settings.serve.api_tokens == ["a" * 20, "b" * 20]
        assert settings.serve.extender.tokens == ["c" * 20]
        assert settings.cloud.write_rate == "none"
        assert settings.cloud.azure.aks_cluster == "fleet-aks"

    def test_the_file_may_come_from_fleetledger_config(self, write_toml: WriteToml) -> None:
        path = write_toml("[testbeds]\nnamespace = 'jobs'\n")

        settings = load_settings(environ={"FLEETLEDGER_CONFIG": str(path)})

        assert settings.testbeds.namespace == "jobs"

    def test_an_empty_variable_counts_as_unset(self) -> None:
        assert load_settings(environ={"FLEETLEDGER_SERVE_PORT": " "}).serve.port == 8080

    def test_every_key_has_its_own_variable(self) -> None:
        names = [key.environment for key in keys()]

        assert len(names) == len(set(names))
        assert environment_name("serve.extender.port") == "FLEETLEDGER_SERVE_EXTENDER_PORT"


def refusal(**kwargs: object) -> str:
    with pytest.raises(ConfigError) as refused:
        load_settings(**kwargs)  # type: ignore[arg-type]
    return str(refused.value)


class TestRefusals:
    @pytest.mark.parametrize(
        ("toml", "expected"),
        [
            (
                "[leadership]\nlease_seconds = inf",
                ": leadership.lease_seconds must be a number of seconds from 1 to 3600, "
                "not 'inf' (not a finite number)",
            ),
            ("[batching]\nmax_batch_size = 0", ": batching.max_batch_size must be an integer"),
            ("[batching]\nmax_batch_size = 4.5", "not '4.5'"),
            ("[serve]\nport = 70000", ": serve.port is refused: 70000 is outside 0-65535"),
            ("[serve]\nport = true", ": serve.port must be a port number from 0 to 65535"),
            ("[serve]\nhost = ''", ": serve.host must not be empty or blank"),
            ("[batching]\ngrouper = 5", ": batching.grouper must be a string, not 5"),
            ("[serve]\ninsecure_no_auth = 'yes please'", ": serve.insecure_no_auth must be true"),
            ("[cloud]\nkind = 'gcp'", ": cloud.kind must be one of 'fake', 'azure-vm' or 'aks'"),
            ("[ipam]\nx_ssf = 1.5", ": ipam.x_ssf must be a number more than 0 and at most 1"),
            ("[testbeds]\nnamespace = 'Not_A_Namespace'", ": testbeds.namespace must be a Kub"),
            ("[serve]\napi_tokens = ['short']", "serve.api_tokens has an unusable token: API"),
            ("[log]\nlevel = 'loud'", ": log.level must be debug, info, warning or error"),
            ("serve = 5", ": serve must be a table, not 5"),
            ("[[pools]]\nname = 'p'", ": pools[0].vm_size is required"),
            ("pools = ['p=Standard_D4s_v5:4000']", ": pools[0] takes NAME=VM_SIZE:CPU_MILLI"),
            ("subnets = ['s=-1']", ": subnets[0].capacity must be an integer from 1"),
            ("[anchoring]\nkey_file = 'a'\ned25519_key = 'b'", "sets both key_file and ed25519"),
            ("[anchoring]\naudit_key = 'short'", ": anchoring.audit_key must be at least 32"),
        ],
    )
    def test_a_bad_value_in_the_file_names_the_file_and_its_key(
        self, write_toml: WriteToml, toml: str, expected: str
    ) -> None:
        path = write_toml(toml)

        message = refusal(environ={}, config_file=path)

        assert message.startswith(f"config file {path}") and expected in message, message

    def test_an_unknown_key_suggests_the_known_one(self, write_toml: WriteToml) -> None:
        """The same name in another section first, else the closest spelling."""
        path = write_toml("[serve]\nlease_seconds = 5\nprot = 1\n")

        message = refusal(environ={}, config_file=path)

        assert "serve.lease_seconds is not a setting; did you mean leadership.lease_seconds?" in (
            message
        )
        assert "serve.prot is not a setting; did you mean port?" in message

    def test_a_bad_variable_is_named(self) -> None:
        message = refusal(environ={"FLEETLEDGER_SERVE_GRACE_SECONDS": "nan"})

        assert message.startswith("environment variable FLEETLEDGER_SERVE_GRACE_SECONDS must be")

    def test_a_bad_flag_is_named(self) -> None:
        message = refusal(flags={"pools": ("--pool", ["a=Standard_D4s_v5:4000:16:wide"])})

        assert message.startswith("--pool takes NAME=VM_SIZE:CPU_MILLI:MEMORY_GIB[:binpack|spread]")

    def test_the_value_refused_is_the_one_that_applies(self, write_toml: WriteToml) -> None:
        """A bad file value overridden by a good variable is no error; a bad variable over a
        good file value is, and the variable is named."""
        path = write_toml("[serve]\nport = 99999\n")

        assert load_settings(environ={"FLEETLEDGER_SERVE_PORT": "81"}, config_file=path)
        message = refusal(environ={"FLEETLEDGER_SERVE_PORT": "-1"}, config_file=path)
        assert message.startswith("environment variable FLEETLEDGER_SERVE_PORT")

    def test_every_refusal_is_one_line_each(self, write_toml: WriteToml) -> None:
        path = write_toml("[serve]\nport = -1\ngrace_seconds = -1\n")

        assert len(refusal(environ={}, config_file=path).splitlines()) == 2

    def test_a_refused_secret_is_not_shown(self, write_toml: WriteToml) -> None:
        """A token in place of the list of tokens: the refusal says so without printing it."""
        secret = "a-secret-token-0123456789"

        message = refusal(environ={}, config_file=write_toml(f"[serve]\napi_tokens = '{secret}'"))

        assert "serve.api_tokens must be a list, not '<redacted>'" in message
        assert secret not in message

    def test_a_missing_file_says_to_check_config(self, tmp_path: Path) -> None:
        message = refusal(environ={}, config_file=tmp_path / "absent.toml")

        assert "cannot read the config file" in message and "--config" in message

    def test_a_file_that_is_not_toml_says_where(self, write_toml: WriteToml) -> None:
        message = refusal(environ={}, config_file=write_toml("[serve\nport = 1\n"))

        assert "is not valid TOML" in message and "line 1" in message
