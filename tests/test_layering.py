"""The domain stays pure: no infrastructure imports, no I/O, no clock, no randomness."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DOMAIN = Path(__file__).resolve().parent.parent / "domain"

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
