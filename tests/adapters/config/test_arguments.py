"""``serve`` resolved through the configuration: a ``--config`` file builds the same settings as
the equivalent flags, and a flag left out never masks the file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from fleetledger.adapters.cli import serve
from fleetledger.adapters.cli.main import build_parser
from fleetledger.adapters.config import apply_settings, command_arguments, settings_for
from fleetledger.adapters.config.arguments import COMMAND_FLAGS, defer_defaults

from .conftest import WriteToml

TOKEN = "extender-token-0123456789abcdef"

AS_FILE = f"""
[serve]
host = "127.0.0.2"
port = 9090
grace_seconds = 12
cluster = "fake"

[serve.extender]
port = 9091
tokens = ["{TOKEN}"]

[leadership]
lease_seconds = 15
lease_name = "fleet"

[nodes]
shard = "1/2"

[cloud]
fake_latency = 0.25
write_burst = 20

[batching]
grouper = "g"
idle_timeout = 0.2
max_timeout = 2
max_batch_size = 10

[placement]
search_steps = 50

[ipam]
max_ips = 110
x_nsf = 3
x_ssf = 0.8
shard = "0/3"

[testbeds]
namespace = "jobs"

[[pools]]
name = "batch"
vm_size = "Standard_D4s_v5"
cpu_milli = 4000
memory_gib = 16
strategy = "spread"

[[pools]]
name = "general"
vm_size = "Standard_D8s_v5"
cpu_milli = 8000
memory_gib = 32

[[subnets]]
id = "aks-pods"
capacity = 1024
"""

AS_FLAGS = [
    *("--host", "127.0.0.2", "--port", "9090", "--grace-seconds", "12", "--cluster", "fake"),
    *("--extender-port", "9091", "--extender-token", TOKEN),
    *("--lease-seconds", "15", "--lease-name", "fleet"),
    *("--nodes-shard", "1/2"),
    *("--fake-latency", "0.25", "--write-burst", "20"),
    *("--grouper", "g", "--idle-timeout", "0.2", "--max-timeout", "2", "--max-batch-size", "10"),
    *("--placement-search-steps", "50"),
    *("--ipam-max-ips", "110", "--ipam-x-nsf", "3", "--ipam-x-ssf", "0.8", "--ipam-shard", "0/3"),
    *("--testbeds-namespace", "jobs"),
    *("--pool", "batch=Standard_D4s_v5:4000:16:spread"),
    *("--pool", "general=Standard_D8s_v5:8000:32"),
    *("--subnet", "aks-pods=1024"),
]


def resolved(argv: list[str]) -> argparse.Namespace:
    """The arguments ``serve`` runs with, as its handler resolves them."""
    args = build_parser().parse_args(argv)
    return command_arguments(args, settings_for(args), environ={})


def serve_options(args: argparse.Namespace) -> dict[str, Any]:
    return {dest: getattr(args, dest) for dest in COMMAND_FLAGS["serve"]}


class TestServeFromTheFile:
    def test_the_file_and_the_flags_build_the_same_settings(self, write_toml: WriteToml) -> None:
        """Every resolved option, and what serve builds of them: the capabilities' settings
        (pools, subnets, IPAM, search) and the extender's listener."""
        from_file = resolved(["--config", str(write_toml(AS_FILE)), "serve"])
        from_flags = resolved(["serve", *AS_FLAGS])

        assert serve_options(from_file) == serve_options(from_flags)
        assert serve._capability_options(from_file) == serve._capability_options(from_flags)
        extenders = [serve._extender_settings(a) for a in (from_file, from_flags)]
        assert [(e.host, e.port, len(e.tokens)) for e in extenders] == [("127.0.0.1", 9091, 1)] * 2

    def test_a_flag_left_out_does_not_mask_the_file(self, write_toml: WriteToml) -> None:
        """serve's flags default to None: the file's port applies, not argparse's 8080."""
        args = resolved(["--config", str(write_toml("[serve]\nport = 9000\n")), "serve"])

        assert args.port == 9000
        assert args.host == "127.0.0.1"  # the model's default

    def test_a_flag_given_beats_the_file(self, write_toml: WriteToml) -> None:
        path = write_toml("[serve]\nport = 9000\n[[subnets]]\nid = 'a'\ncapacity = 1\n")

        args = resolved(["--config", str(path), "serve", "--port", "8080", "--subnet", "b=2"])

        assert (args.port, args.subnet) == (8080, ["b=2"])

    def test_without_a_file_the_flags_defaults_are_the_models(self) -> None:
        args = resolved(["serve"])

        assert (args.host, args.port, args.lease_seconds, args.max_body_bytes) == (
            "127.0.0.1",
            8080,
            10.0,
            1024 * 1024,
        )
        assert (args.pool, args.subnet, args.api_token, args.insecure_no_auth) == (
            [],
            [],
            None,
            False,
        )

    def test_the_files_database_url_reaches_the_command(self, write_toml: WriteToml) -> None:
        path = write_toml("[database]\nurl = 'sqlite:///elsewhere.db'\n")
        args = build_parser().parse_args(["--config", str(path), "serve"])

        apply_settings(args)

        assert args.url == "sqlite:///elsewhere.db"


class TestAdapterEnvironment:
    def test_the_cloud_profile_and_budget_reach_the_adapters_environment(
        self, write_toml: WriteToml
    ) -> None:
        """The cloud adapters and the anchor signer read their settings from the environment:
        they get the file's under the variables' names."""
        path = write_toml(
            "[cloud]\nwrite_rate = 'none'\nmax_concurrent_batches = 64\n"
            "[cloud.azure]\nresource_group = 'fleet-rg'\naks_cluster = 'aks'\n"
        )

        args = resolved(["--config", str(path), "serve"])

        assert args.write_rate is None and args.max_concurrent_batches == 64
        assert {
            name: args.environ.get(name)
            for name in (
                "FLEETLEDGER_WRITE_RATE",
                "FLEETLEDGER_MAX_CONCURRENT_BATCHES",
                "FLEETLEDGER_AZURE_RESOURCE_GROUP",
                "FLEETLEDGER_AKS_CLUSTER",
            )
        } == {
            "FLEETLEDGER_WRITE_RATE": "none",
            "FLEETLEDGER_MAX_CONCURRENT_BATCHES": "64",
            "FLEETLEDGER_AZURE_RESOURCE_GROUP": "fleet-rg",
            "FLEETLEDGER_AKS_CLUSTER": "aks",
        }

    def test_the_anchor_signer_takes_the_files_audit_key(
        self, write_toml: WriteToml, tmp_path: Path
    ) -> None:
        key = "k" * 40
        path = write_toml(
            f"[anchoring]\nfile = '{tmp_path / 'anchor.json'}'\naudit_key = '{key}'\n"
        )

        signer = serve._serve_anchor_signer(resolved(["--config", str(path), "serve"]))

        assert signer is not None


class TestDeferredDefaults:
    def test_a_flag_default_that_differs_from_the_models_is_refused(self) -> None:
        """Two defaults would drift apart: registering one is an error at once."""
        parser = argparse.ArgumentParser()
        parser.add_argument("--port", type=int, default=1234)

        with pytest.raises(ValueError, match=r"defaults to 1234 but serve\.port to 8080"):
            defer_defaults(parser, "serve")

    def test_the_help_still_shows_the_default(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--help"])

        assert "the API's port (default: 8080)" in " ".join(capsys.readouterr().out.split())
