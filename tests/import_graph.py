"""The static import graph of fleetledger's own modules, read from the source with ``ast``.

Every import counts, wherever it stands (module level, ``TYPE_CHECKING`` blocks, inside
functions): static tools follow them all, and a lazy import that closes a circle only hides it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL_PACKAGES = ("adapters", "domain", "eventstore", "migrations", "projections")


@dataclass(frozen=True, slots=True)
class Import:
    """``importer`` imports ``imported`` (a fleetledger module) at ``line``, naming ``source`` in
    the statement: ``from fleetledger.domain.testbeds import testbed`` imports the submodule
    ``…testbeds.testbed`` through the package's surface, ``…testbeds``."""

    importer: str
    imported: str
    source: str
    line: int


def module_name(path: Path, *, root: Path = ROOT) -> str:
    """The dotted name ``path`` imports as: ``domain/nodes/model.py`` is
    ``fleetledger.domain.nodes.model``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["fleetledger", *parts]) if parts[0] != "fleetledger" else ".".join(parts)


def product_files(root: Path = ROOT) -> list[Path]:
    """Every module the wheel ships: the five top-level packages and ``fleetledger/``'s own."""
    files = [p for top in TOP_LEVEL_PACKAGES for p in sorted((root / top).rglob("*.py"))]
    return [*files, *sorted(p for p in (root / "fleetledger").glob("*.py") if not p.is_symlink())]


def imports_of(path: Path, modules: set[str], *, root: Path = ROOT) -> list[Import]:
    """The fleetledger modules ``path`` imports; ``from package import name`` counts as importing
    the submodule when ``name`` is one, else the package."""
    importer = module_name(path, root=root)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            pairs = [(alias.name, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            pairs = [
                (
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source,
                    source,
                )
                for alias in node.names
            ]
        else:
            continue
        found.extend(
            Import(importer, target, source, node.lineno)
            for target, source in dict.fromkeys(pairs)
            if target.startswith("fleetledger.") and target != importer
        )
    return found


def import_graph(root: Path = ROOT) -> dict[str, list[Import]]:
    """Each product module's imports of other product modules."""
    files = product_files(root)
    modules = {module_name(p, root=root) for p in files}
    return {module_name(p, root=root): imports_of(p, modules, root=root) for p in files}


def cycles(graph: dict[str, list[Import]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules (Tarjan's
    algorithm, iterative so a deep graph cannot exhaust the stack)."""
    edges = {
        m: sorted({i.imported for i in imports if i.imported in graph})
        for m, imports in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if child < len(edges[node]):
                work.append((node, child + 1))
                target = edges[node][child]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            for target in edges[node]:
                if target in on_stack:
                    low[node] = min(low[node], low[target])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups
