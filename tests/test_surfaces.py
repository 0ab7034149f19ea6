"""Every package's public surface behaves as one: what ``__all__`` names is there, is public,
and is exactly what a star import brings; each domain capability offers its aggregates'
``decide``/``evolve``/``initial_state``.

Which names a package exports is each package's own decision (reviewed where it is made); these
tests hold the properties every surface must have, for all of them at once.
"""

from __future__ import annotations

import importlib
import types

import pytest

from tests.import_graph import ROOT, module_name, product_files

PACKAGES = sorted(
    module_name(p)
    for p in product_files()
    if p.name == "__init__.py" and "migrations" not in p.relative_to(ROOT).parts
)
CAPABILITIES = ("ipam", "machines", "nodes", "placement", "testbeds")


def test_every_package_is_checked() -> None:
    """The packages below are found on disk (an empty list would pass everything)."""
    assert {f"fleetledger.domain.{c}" for c in CAPABILITIES} <= set(PACKAGES)
    assert {f"fleetledger.adapters.{c}" for c in CAPABILITIES} <= set(PACKAGES)


@pytest.mark.parametrize("name", PACKAGES)
class TestPackageSurface:
    def test_declares_its_surface(self, name: str) -> None:
        """A package says what it exports: ``__all__`` is a list of unique strings."""
        package = importlib.import_module(name)
        exported = getattr(package, "__all__", None)
        assert isinstance(exported, list), f"{name} has no __all__ list"
        assert all(isinstance(n, str) for n in exported)
        assert len(set(exported)) == len(exported), f"{name} exports a name twice"

    def test_exports_only_public_names_that_exist(self, name: str) -> None:
        """Every exported name resolves, and none is private."""
        package = importlib.import_module(name)
        missing = [n for n in package.__all__ if not hasattr(package, n)]
        private = [n for n in package.__all__ if n.startswith("_")]
        assert (missing, private) == ([], [])

    def test_a_star_import_brings_exactly_the_surface(self, name: str) -> None:
        """``from package import *`` binds the exported names and nothing else."""
        namespace: dict[str, object] = {}
        exec(f"from {name} import *", namespace)
        namespace.pop("__builtins__")
        assert set(namespace) == set(importlib.import_module(name).__all__)


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_a_domain_capability_exports_its_aggregates(capability: str) -> None:
    """Each domain capability exports at least one aggregate, as a module or by name, with the
    pure functions the decider host folds and decides with."""
    package = importlib.import_module(f"fleetledger.domain.{capability}")
    aggregates = [package] + [
        value for value in vars(package).values() if isinstance(value, types.ModuleType)
    ]
    offered = [
        a
        for a in aggregates
        if all(callable(getattr(a, f, None)) for f in ("decide", "evolve", "initial_state"))
    ]
    assert offered, f"fleetledger.domain.{capability} exports no decide/evolve/initial_state"
