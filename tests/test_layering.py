"""The layers hold: the domain stays pure (no infrastructure imports, no I/O, no clock, no
randomness), capabilities meet only through their public surfaces and named ports, and no two
modules import each other, however indirectly."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.import_graph import Import, cycles, import_graph

DOMAIN = Path(__file__).resolve().parent.parent / "domain"
CAPABILITIES = ("ipam", "machines", "nodes", "placement", "testbeds")

# fleetledger's own outer layers: the domain may import only fleetledger.domain.
FORBIDDEN_PACKAGES = {
    "fleetledger.eventstore",
    "fleetledger.projections",
    "fleetledger.adapters",
    "fleetledger.migrations",
}
FORBIDDEN_MODULES = {
    "sqlalchemy",
    "psycopg",
    "alembic",
    "kubernetes",
    "azure",
    "structlog",
    "time",
    "random",
    "secrets",
    "os",
    "pathlib",
    "socket",
    "subprocess",
    "threading",
    "asyncio",
    "logging",
}
# Calls that read the clock or draw randomness even through an allowed module.
FORBIDDEN_ATTRIBUTES = {"now", "utcnow", "today", "uuid1", "uuid4", "urandom"}
FORBIDDEN_BUILTINS = {"open", "input", "print"}


def _domain_files() -> list[Path]:
    return sorted(DOMAIN.rglob("*.py"))


def _within(name: str, packages: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # "from fleetledger import adapters" names the package in the alias.
            module = node.module or ""
            names = [module, *(f"{module}.{a.name}" for a in node.names)] if node.level == 0 else []
        else:
            names = []
        forbidden = [
            name
            for name in names
            if name.split(".")[0] in FORBIDDEN_MODULES or _within(name, FORBIDDEN_PACKAGES)
        ]
        if forbidden:
            found.append(f"{path.name}:{getattr(node, 'lineno', '?')} imports {forbidden[0]}")
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append(f"{path.name}:{node.lineno} uses .{node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in FORBIDDEN_BUILTINS
        ):
            found.append(f"{path.name}:{node.lineno} calls {node.func.id}()")
    return found


class TestDomainPurity:
    def test_domain_has_modules(self) -> None:
        """The check looks at real files (an empty glob would make it pass vacuously)."""
        assert any(p.name != "__init__.py" for p in _domain_files())

    @pytest.mark.parametrize("path", _domain_files(), ids=lambda p: p.name)
    def test_module_is_pure(self, path: Path) -> None:
        """A domain module imports no infrastructure and reads no clock or randomness."""
        assert _violations(path) == []

    def test_checker_catches_violations(self, tmp_path: Path) -> None:
        """The checker itself flags each kind of violation (so it cannot silently pass)."""
        bad = tmp_path / "bad.py"
        bad.write_text(
            "import time\nfrom sqlalchemy import select\nimport datetime\n"
            "x = datetime.datetime.now()\nopen('f')\n"
            "from fleetledger.eventstore import NewEvent\nimport fleetledger.adapters.cli\n"
            "from fleetledger.domain import grouper\nfrom fleetledger import projections\n",
            encoding="utf-8",
        )
        assert len(_violations(bad)) == 7


def _capability(module: str, layer: str) -> str | None:
    """The capability package ``module`` belongs to in ``layer`` (``domain`` or ``adapters``)."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == layer and parts[2] in CAPABILITIES:
        return parts[2]
    return None


def _shared_domain_modules(graph: dict[str, list[Import]]) -> set[str]:
    return {
        m
        for m in graph
        if m.startswith("fleetledger.domain.")
        and m.count(".") == 2
        and _capability(m, "domain") is None
    }


def domain_boundary_violations(graph: dict[str, list[Import]]) -> list[str]:
    """A domain capability imports only the shared domain modules and its own package; any
    other package reaches a capability's modules only through the capability's ``__init__``."""
    shared = _shared_domain_modules(graph)
    found = []
    for importer, imports in sorted(graph.items()):
        own = _capability(importer, "domain")
        for i in imports:
            target = _capability(i.imported, "domain")
            if own is not None and target != own and i.imported not in shared:
                found.append(f"{importer}:{i.line} imports {i.imported}")
            elif own is None and target is not None:
                surface = f"fleetledger.domain.{target}"
                if surface not in (i.imported, i.source):
                    found.append(f"{importer}:{i.line} reaches into {i.source}")
    return found


def adapter_boundary_violations(graph: dict[str, list[Import]]) -> list[str]:
    """A capability's adapters import another capability's adapters only through its named
    port module (``fleetledger.adapters.<capability>.port``)."""
    found = []
    for importer, imports in sorted(graph.items()):
        own = _capability(importer, "adapters")
        if own is None:
            continue
        for i in imports:
            other = _capability(i.imported, "adapters")
            if other not in (None, own) and i.imported != f"fleetledger.adapters.{other}.port":
                found.append(f"{importer}:{i.line} imports {i.imported}")
    return found


def _graph(*edges: tuple[str, str, str]) -> dict[str, list[Import]]:
    graph: dict[str, list[Import]] = {}
    for importer, imported, source in edges:
        graph.setdefault(importer, []).append(Import(importer, imported, source, 1))
        graph.setdefault(imported, [])
    return graph


class TestCapabilityBoundaries:
    @pytest.fixture(scope="class")
    @classmethod
    def graph(cls) -> dict[str, list[Import]]:
        return import_graph()

    def test_the_graph_sees_every_capability(self, graph: dict[str, list[Import]]) -> None:
        """Each capability has domain and adapter modules in the graph (an empty graph would
        make the rules below pass vacuously)."""
        for layer in ("domain", "adapters"):
            assert {_capability(m, layer) for m in graph} >= set(CAPABILITIES)

    def test_domain_capabilities_keep_to_themselves(self, graph: dict[str, list[Import]]) -> None:
        """No domain capability imports another; other packages use a capability's surface."""
        assert domain_boundary_violations(graph) == []

    def test_capability_adapters_meet_through_ports(self, graph: dict[str, list[Import]]) -> None:
        """Placement's adapters use node accounting's and VM creation's only through their
        ports."""
        assert adapter_boundary_violations(graph) == []

    def test_the_domain_rule_flags_a_capability_importing_another(self) -> None:
        """Placement importing node accounting is flagged; importing a shared module is not."""
        graph = _graph(
            ("fleetledger.domain.placement.planner", "fleetledger.domain.nodes", "x"),
            ("fleetledger.domain.placement.planner", "fleetledger.domain.units", "x"),
        )
        assert domain_boundary_violations(graph) == [
            "fleetledger.domain.placement.planner:1 imports fleetledger.domain.nodes"
        ]

    def test_the_domain_rule_flags_reaching_past_a_surface(self) -> None:
        """An adapter importing a capability's module directly is flagged; a submodule the
        package exports (``from …testbeds import testbed``) is not."""
        graph = _graph(
            (
                "fleetledger.adapters.x",
                "fleetledger.domain.nodes.model",
                "fleetledger.domain.nodes.model",
            ),
            (
                "fleetledger.adapters.x",
                "fleetledger.domain.testbeds.testbed",
                "fleetledger.domain.testbeds",
            ),
        )
        assert domain_boundary_violations(graph) == [
            "fleetledger.adapters.x:1 reaches into fleetledger.domain.nodes.model"
        ]

    def test_the_adapter_rule_flags_a_capability_past_the_port(self) -> None:
        """Placement's adapter importing the nodes' service module is flagged; the port is not."""
        graph = _graph(
            ("fleetledger.adapters.placement.s", "fleetledger.adapters.nodes.service", "x"),
            ("fleetledger.adapters.placement.s", "fleetledger.adapters.nodes.port", "x"),
        )
        assert adapter_boundary_violations(graph) == [
            "fleetledger.adapters.placement.s:1 imports fleetledger.adapters.nodes.service"
        ]


class TestImportCircles:
    def test_no_module_imports_itself_through_others(self) -> None:
        """The product's import graph has no circle, lazy or ``TYPE_CHECKING`` imports included."""
        assert cycles(import_graph()) == []

    def test_circles_are_found(self) -> None:
        """A two-module and a three-module circle are both reported; a chain is not."""
        graph = _graph(
            ("fleetledger.a", "fleetledger.b", "x"),
            ("fleetledger.b", "fleetledger.a", "x"),
            ("fleetledger.c", "fleetledger.d", "x"),
            ("fleetledger.d", "fleetledger.e", "x"),
            ("fleetledger.e", "fleetledger.c", "x"),
            ("fleetledger.e", "fleetledger.f", "x"),
        )
        assert sorted(cycles(graph)) == [
            ["fleetledger.a", "fleetledger.b"],
            ["fleetledger.c", "fleetledger.d", "fleetledger.e"],
        ]
