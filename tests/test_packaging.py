"""fleetledger installs as one ``fleetledger`` namespace and works from a wheel beside user code."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path
from typing import Any

import pytest

from fleetledger.eventstore import migrate
from tests.import_graph import TOP_LEVEL_PACKAGES, import_graph, module_name, product_files

ROOT = Path(__file__).resolve().parent.parent
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", "*.db"
)

USER_TEST = """
import adapters
import domain
import migrations
from fleetledger.eventstore import NO_STREAM, EventStore, NewEvent


def test_the_users_packages_are_their_own() -> None:
    assert (domain.OWNER, adapters.OWNER, migrations.OWNER) == ("user", "user", "user")


def test_sqlite_store(sqlite_store: EventStore) -> None:
    sqlite_store.append("order-1", [NewEvent("Placed", {"n": 1})], expected_version=NO_STREAM)
    assert sqlite_store.head() == 1


def test_postgres_store(postgres_store: EventStore) -> None:
    postgres_store.append("order-1", [NewEvent("Placed", {"n": 2})], expected_version=NO_STREAM)
    assert postgres_store.verify().ok
"""


def _setuptools_table() -> Any:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _package_folders() -> set[str]:
    return {"fleetledger"} | {
        "fleetledger." + str(init.parent.relative_to(ROOT)).replace(os.sep, ".")
        for top in TOP_LEVEL_PACKAGES
        for init in (ROOT / top).rglob("__init__.py")
    }


class TestPackageList:
    def test_every_package_folder_is_listed(self) -> None:
        """The explicit package list names exactly the package folders on disk, so a new
        subpackage cannot be left out of the wheel."""
        assert set(_setuptools_table()["packages"]) == _package_folders()

    def test_each_top_level_folder_maps_into_the_namespace(self) -> None:
        """Each top-level folder is mapped to ``fleetledger.<folder>``, the ``fleetledger/``
        folder to the ``fleetledger`` package itself, and nothing else is."""
        mapping = _setuptools_table()["package-dir"]
        assert mapping == {
            "fleetledger": "fleetledger",
            **{f"fleetledger.{top}": top for top in TOP_LEVEL_PACKAGES},
        }

    def test_the_namespace_folder_links_each_top_level_folder(self) -> None:
        """``fleetledger/`` holds one relative link per top-level folder, so static tools see
        ``fleetledger.<folder>`` where Python finds it, from any checkout's location."""
        links = {p.name: p for p in (ROOT / "fleetledger").iterdir() if p.is_symlink()}
        assert sorted(links) == sorted(TOP_LEVEL_PACKAGES)
        for name, link in links.items():
            assert os.readlink(link) == f"../{name}"
            assert link.resolve() == (ROOT / name).resolve()

    def test_every_shipped_module_is_used_by_the_product(self) -> None:
        """Each module the wheel ships is imported by another, is a package holding one that is,
        or is an entry point: nothing only the tests use (a fake server, a test helper) ships."""
        graph = import_graph()
        imported = {i.imported for imports in graph.values() for i in imports}
        used = imported | {m.rpartition(".")[0] for m in imported}
        while (parents := {m.rpartition(".")[0] for m in used} - used) - {""}:
            used |= parents
        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        entry_points = {
            *(target.partition(":")[0] for target in project["scripts"].values()),
            *project["entry-points"]["pytest11"].values(),
            "fleetledger.__main__",
            "fleetledger.migrations.env",  # Alembic loads these by path
        }
        unused = {
            m
            for m in graph
            if m not in used
            and m not in entry_points
            and not m.startswith("fleetledger.migrations.versions")
        }
        assert unused == set()


# The commands run here are the scratch environment's, installed without bytecode (see
# ``installed``): they write it as they import, so that only the first run compiles.
_SCRATCH_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _run(
    args: list[str | Path],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    stdout_only: bool = False,
) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=_SCRATCH_ENV if env is None else env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{output}"
    return result.stdout if stdout_only else output


SCRATCH = "sqlite:///scratch.db"
"""A scratch log in the user's project folder, migrated first where a command needs one."""

CHEAPEST_RUNS: dict[str, list[list[str]]] = {
    "db": [["db", "upgrade", "--url", SCRATCH], ["db", "current", "--url", SCRATCH]],
    "events": [
        ["events", "types"],
        ["db", "upgrade", "--url", SCRATCH],
        ["events", "tail", "--url", SCRATCH, "--type", "vm.BatchSealed"],
    ],
    "audit": [["db", "upgrade", "--url", SCRATCH], ["audit", "verify", "--url", SCRATCH]],
    "bench": [["bench", "grouper", "--requests", "200", "--repeat", "1"]],
    "simulate": [["simulate", "--help"]],
    "serve": [["serve", "--help"]],
    "dumpstate": [["db", "upgrade", "--url", SCRATCH], ["dumpstate", "--url", SCRATCH]],
    "extender": [["extender", "--help"]],
    "completion": [["completion", "bash"], ["completion", "zsh"], ["completion", "fish"]],
    "config": [["config", "show"]],
    "replay": [["db", "upgrade", "--url", SCRATCH], ["replay", "--url", SCRATCH, "--until", "0"]],
    "explain": [["explain", "--help"]],
}
"""Each top-level command's cheapest invocation from a plain install (a run where it is quick;
``--help`` for servers, for ``simulate``, which other tests here run for real, and for
``explain``, which needs a log holding what it explains)."""


def _top_level_commands() -> set[str]:
    from fleetledger.adapters.cli.main import build_parser

    [commands] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(commands.choices)


def test_every_command_has_a_cheapest_run() -> None:
    """A command added to the CLI gets a line in :data:`CHEAPEST_RUNS`, so the installed wheel
    runs it."""
    assert _top_level_commands() - set(CHEAPEST_RUNS) == set()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The sdist and wheel built from this checkout, and what the build printed."""
    dist = tmp_path_factory.mktemp("dist")
    # Built from a copy: a build writes egg-info and build/ into its source tree, which other test
    # processes (and an editable install) share.
    source = tmp_path_factory.mktemp("source") / "fleetledger"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    # With bytecode writing off, setuptools prints "warning: byte-compiling is disabled": a note
    # about this environment, not about the package.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    output = _run([sys.executable, "-m", "build", "--outdir", dist, source], cwd=source, env=env)
    return dist, output


@pytest.mark.slow
class TestBuild:
    def test_build_prints_no_warnings(self, built: tuple[Path, str]) -> None:
        """``python -m build`` makes an sdist and a wheel without a single warning."""
        dist, output = built
        assert sorted(p.suffix for p in dist.iterdir()) == [".gz", ".whl"]
        assert "warning" not in output.lower(), output

    def test_wheel_holds_only_the_fleetledger_namespace(self, built: tuple[Path, str]) -> None:
        """Nothing but ``fleetledger/`` (and the wheel's metadata) sits at the wheel's top."""
        [wheel] = built[0].glob("*.whl")
        tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
        assert tops == {"fleetledger", "fleetledger-0.1.0.dist-info"}

    def test_the_wheel_ships_the_product_modules_and_nothing_else(
        self, built: tuple[Path, str]
    ) -> None:
        """The wheel's Python modules are exactly the product's (so no test server, such as the
        fake ARM server the cloud adapters' tests run, is installed)."""
        [wheel] = built[0].glob("*.whl")
        shipped = {
            name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            for name in zipfile.ZipFile(wheel).namelist()
            if name.endswith(".py")
        }
        assert shipped == {module_name(p) for p in product_files()}
        assert not any("fake_arm" in name for name in shipped)

    def test_migrations_and_type_markers_ship_inside(self, built: tuple[Path, str]) -> None:
        """The Alembic scripts and ``py.typed`` markers are in the wheel, under the namespace."""
        [wheel] = built[0].glob("*.whl")
        names = set(zipfile.ZipFile(wheel).namelist())
        assert "fleetledger/migrations/env.py" in names
        assert "fleetledger/migrations/script.py.mako" in names
        assert any(n.startswith("fleetledger/migrations/versions/0001_") for n in names)
        assert {f"fleetledger/{top}/py.typed" for top in TOP_LEVEL_PACKAGES} <= names


@pytest.fixture(scope="module")
def installed(built: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin/`` of a fresh virtual environment with the wheel (and pytest) installed."""
    [wheel] = built[0].glob("*.whl")
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # Without compiling every installed module to bytecode up front: half of the install's
    # time, spent mostly on the Azure and Kubernetes SDKs' thousands of modules that no command
    # here imports. What a command imports is compiled and kept the first time it runs.
    _run([python, "-m", "pip", "install", "--quiet", "--no-compile", wheel, "pytest"], cwd=env_dir)
    return env_dir / "bin"


@pytest.mark.slow
@pytest.mark.postgres
class TestInstalledWheel:
    """The wheel installed into a fresh virtual environment, used from a user's own project
    whose ``domain/``, ``adapters/`` and ``migrations/`` packages must stay theirs."""

    @pytest.fixture
    def project(self, tmp_path: Path) -> Path:
        for name in ("domain", "adapters", "migrations"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "__init__.py").write_text('OWNER = "user"\n', encoding="utf-8")
        (tmp_path / "test_user.py").write_text(USER_TEST, encoding="utf-8")
        return tmp_path

    def test_help_and_version(self, installed: Path, project: Path) -> None:
        """``fleetledger --help`` and ``--version`` run from the user's project folder."""
        assert "simulate" in _run([installed / "fleetledger", "--help"], cwd=project)
        assert _run([installed / "fleetledger", "--version"], cwd=project).strip() == (
            "fleetledger 0.1.0"
        )

    def test_db_upgrade_finds_the_packaged_migrations(self, installed: Path, project: Path) -> None:
        """``db upgrade`` migrates with the scripts inside the wheel, not the user's
        ``migrations/`` folder or a checkout's."""
        url = f"sqlite:///{project / 'ledger.db'}"
        _run([installed / "fleetledger", "db", "upgrade", "--url", url], cwd=project)
        current = _run([installed / "fleetledger", "db", "current", "--url", url], cwd=project)
        assert migrate.head_revision() in current

    def test_simulate_runs(self, installed: Path, project: Path) -> None:
        """The main job runs from the wheel, and the README's next steps read its log."""
        cli = installed / "fleetledger"
        output = _run([cli, "simulate", "--scenario", "burst-vms", "--json"], cwd=project)
        assert '"cloud_calls"' in output
        log = ["--url", "sqlite:///fleetledger-sim.db"]
        assert " vm." in _run([cli, "events", "tail", *log], cwd=project)
        _run([cli, "audit", "verify", *log], cwd=project)
        assert json.loads(_run([cli, "dumpstate", *log], cwd=project, stdout_only=True))

    def test_python_m_runs_the_command_line(self, installed: Path, project: Path) -> None:
        """``python -m fleetledger`` is the ``fleetledger`` script."""
        version = _run([installed / "python", "-m", "fleetledger", "--version"], cwd=project)
        assert version.strip() == "fleetledger 0.1.0"

    @pytest.mark.parametrize("scenario", ["subnet", "restart", "burst-workloads", "testbed"])
    def test_every_capabilitys_scenario_runs(
        self, installed: Path, project: Path, scenario: str
    ) -> None:
        """Each scenario the README names runs from a plain install of the wheel (no test-only
        package is needed at run time)."""
        output = _run(
            [installed / "fleetledger", "simulate", "--scenario", scenario, "--json"],
            cwd=project,
            stdout_only=True,
        )
        assert json.loads(output)

    @pytest.mark.parametrize(
        "bench",
        [
            ["grouper", "--requests", "2000", "--repeat", "1"],
            ["placement", "--nodes", "20", "--batch", "10", "--url", "sqlite:///bench.db"],
            [
                *("reliability", "--requests", "20", "--url", "sqlite:///bench.db"),
                *("--fuzz-inputs", "1", "--idle-connections", "2", "--seeds", "1"),
            ],
        ],
        ids=lambda args: args[0],
    )
    def test_benches_run_from_a_plain_install(
        self, installed: Path, project: Path, bench: list[str]
    ) -> None:
        """The benchmarks a user can run on embedded SQLite run from the wheel alone."""
        cli = installed / "fleetledger"
        assert json.loads(_run([cli, "bench", *bench, "--json"], cwd=project, stdout_only=True))

    @pytest.mark.parametrize("command", sorted(CHEAPEST_RUNS))
    def test_every_command_runs_from_a_plain_install(
        self, installed: Path, project: Path, command: str
    ) -> None:
        """Each top-level command runs from the wheel installed without extras (the image
        installs the same wheel), each in a fresh project folder."""
        if command not in _top_level_commands():
            pytest.skip(f"this build has no `{command}` command")
        for argv in CHEAPEST_RUNS[command]:
            _run([installed / "fleetledger", *argv], cwd=project)

    def test_the_plugin_serves_a_users_tests(
        self, installed: Path, project: Path, eventstore_postgres_server: str
    ) -> None:
        """A user's tests get ``sqlite_store`` and ``postgres_store`` from the installed plugin,
        while their own ``domain``, ``adapters`` and ``migrations`` import as theirs."""
        env = {**os.environ, "FLEETLEDGER_TEST_DATABASE_URL": eventstore_postgres_server}
        env.pop("PYTHONPATH", None)
        output = _run(
            [installed / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=project,
            env=env,
        )
        assert "3 passed" in output
