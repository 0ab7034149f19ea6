"""The documentation stays true to the code: the generated event catalog is current, links and
section citations resolve, and the code cites only documents the repository holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetledger.adapters.cli import main
from fleetledger.adapters.cli.events import event_catalog, markdown, shape_catalog

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
SOURCE_FOLDERS = ("adapters", "domain", "eventstore", "projections", "migrations", "tests")

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CITATION = re.compile(r'docs/ARCHITECTURE\.md, "([^"]+)"')
_OUTSIDE = re.compile(r"PRODUCT\.md|design/|seeds/")


def python_sources() -> list[Path]:
    """The repository's Python files, but this one (its own docstrings show the patterns)."""
    return [
        path
        for folder in SOURCE_FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != Path(__file__).resolve()
    ]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


def headings(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


class TestEventsPage:
    def test_docs_events_md_is_current(self) -> None:
        """docs/EVENTS.md is what the codec registry gives today; regenerate it with
        ``fleetledger events types --markdown > docs/EVENTS.md`` after changing an event."""
        committed = (DOCS / "EVENTS.md").read_text(encoding="utf-8")
        assert committed == markdown(event_catalog(), shape_catalog()), (
            "docs/EVENTS.md is out of date: run "
            "`fleetledger events types --markdown > docs/EVENTS.md`"
        )

    def test_the_command_prints_the_page(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["events", "types", "--markdown"]) == 0
        assert capsys.readouterr().out == (DOCS / "EVENTS.md").read_text(encoding="utf-8")

    def test_every_type_has_a_section(self) -> None:
        sections = headings(DOCS / "EVENTS.md")
        for info in event_catalog():
            assert f"`{info.name}` (v{info.version})" in sections


class TestLinks:
    @pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
    def test_relative_links_reach_a_file_and_a_heading(self, page: Path) -> None:
        """Every link to a file of the repository finds it, and its ``#anchor`` a heading."""
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        broken = []
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path_part, _, anchor = target.partition("#")
            linked = (page.parent / path_part).resolve() if path_part else page
            if not linked.exists() or (anchor and anchor not in map(slug, headings(linked))):
                broken.append(target)
        assert broken == []


class TestCommandsInTheDocs:
    def test_every_type_filter_names_a_registered_type(self) -> None:
        """``events tail --type NAME`` in the README, docs and runbooks names a type the log
        can hold (the command refuses any other)."""
        registered = {info.name for info in event_catalog()}
        pages = [*PAGES, *sorted((ROOT / "ops" / "runbooks").glob("*.md"))]
        named = {
            name
            for page in pages
            for name in re.findall(
                r"events tail[^`\n]*?\s--type\s+([A-Za-z][\w.]*)",
                re.sub(r"\s+", " ", page.read_text(encoding="utf-8")),
            )
        }
        named = {name for name in named if not name.isupper()}  # placeholders: NAME, TYPE
        assert named and named <= registered, named - registered


class TestCitations:
    def test_the_code_cites_no_document_outside_the_repository(self) -> None:
        """The design notes the code relies on are docs/ARCHITECTURE.md's sections."""
        citing = [
            f"{path.relative_to(ROOT)}:{number}"
            for path in python_sources()
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if _OUTSIDE.search(line)
        ]
        assert citing == []

    def test_cited_sections_exist(self) -> None:
        """A ``docs/ARCHITECTURE.md, "Section"`` citation names one of its headings (a citation
        may wrap after any word)."""
        sections = {" ".join(h.split()) for h in headings(DOCS / "ARCHITECTURE.md")}
        cited = set()
        for path in python_sources():
            text = re.sub(r"\s*\n\s*", " ", path.read_text(encoding="utf-8"))
            cited |= {" ".join(name.split()) for name in _CITATION.findall(text)}
        assert cited, "no citation found: has the citation format changed?"
        assert cited - sections == set()


class TestQuickStart:
    def test_the_readme_keeps_the_two_set_up_commands(self) -> None:
        """``make run`` and ``make test``, each in a block of its own, and both Makefile targets."""
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
        for target in ("run", "test"):
            assert f"```sh\nmake {target}\n```" in readme
            assert re.search(rf"^{target}:", makefile, flags=re.MULTILINE)

    def test_every_docs_page_is_linked_from_the_readme(self) -> None:
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        assert [p.name for p in DOCS.glob("*.md") if f"](docs/{p.name})" not in readme] == []

    def test_license_and_changelog(self) -> None:
        assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
        assert "## [Unreleased]" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
