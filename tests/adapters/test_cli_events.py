"""``fleetledger events types`` and the type filter of ``events tail``."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest

from fleetledger.adapters.cli import EXIT_USAGE, main
from fleetledger.adapters.cli.events import (
    CODEC_MODULES,
    close_matches,
    event_catalog,
    markdown,
    shape_catalog,
)
from fleetledger.eventstore import NewEvent, open_store

ROOT = Path(__file__).resolve().parents[2]

# A module that builds a codec or registers an event adds types the catalog must list.
_REGISTERS = re.compile(r"\bEventCodec\(|@register_event\(|\bregister_event\(_")


def appended(url: str, *events: NewEvent) -> None:
    with contextlib.closing(open_store(url)) as store:
        store.append("cli-events-1", list(events))


class TestCatalog:
    def test_every_module_that_registers_events_is_imported(self) -> None:
        """Each source module building an ``EventCodec`` or registering an event is one the
        catalog imports: a new capability's types cannot be left out of the list."""
        registering = set()
        for top in ("adapters", "domain"):
            for path in (ROOT / top).rglob("*.py"):
                if path.name == "codec.py" and path.parent.name == "runtime":
                    continue  # defines EventCodec itself
                if _REGISTERS.search(path.read_text(encoding="utf-8")):
                    dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                    registering.add(f"fleetledger.{dotted}")
        assert registering <= set(CODEC_MODULES), sorted(registering - set(CODEC_MODULES))

    def test_lists_the_types_only_adapters_register(self) -> None:
        """Types registered outside the domain's codec (throttling, testbed deletion) are
        listed beside the domain's own."""
        names = {info.name for info in event_catalog()}
        assert {"vm.BatchSealed", "vm.BatchThrottled", "testbed.TestbedDeleted"} <= names

    def test_fields_are_shown_with_their_types(self) -> None:
        """A field's annotation is written as the codec reads it, optional and literal values
        included."""
        [throttled] = [i for i in event_catalog() if i.name == "vm.BatchThrottled"]
        fields = {f.name: f.type for f in throttled.fields}
        assert fields["write_rate"] == "float | None"
        assert fields["at"] == "datetime"
        assert throttled.version == 1 and throttled.summary.startswith("The batch waits")

    def test_shapes_inside_events_are_described(self) -> None:
        """The dataclasses events hold (a machine template) get their own field lists."""
        shapes = {shape.name: shape for shape in shape_catalog()}
        assert "vm_size" in {f.name for f in shapes["MachineTemplate"].fields}
        assert "to_data()" in shapes["MachineTemplate"].summary

    def test_markdown_has_a_section_per_type(self) -> None:
        page = markdown(event_catalog(), shape_catalog())
        assert page.count("\n### `vm.") == sum(1 for i in event_catalog() if i.context == "vm")
        assert "| `write_rate` | `float \\| None` |" in page


class TestTypesCommand:
    def test_prints_one_line_per_type(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["events", "types"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == len(event_catalog())
        assert any(re.match(r"vm\.BatchSealed\s+v1\s+batch_id", line) for line in lines)

    def test_json(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["events", "types", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        sealed = next(entry for entry in listed if entry["name"] == "vm.BatchSealed")
        assert sealed["version"] == 1 and sealed["fields"][0]["name"] == "batch_id"

    def test_json_and_markdown_conflict(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exit_:
            main(["events", "types", "--json", "--markdown"])
        assert exit_.value.code == EXIT_USAGE


class TestTailTypeFilter:
    def test_an_unknown_type_names_the_registered_one(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--type BatchSealed`` is a usage error pointing at ``vm.BatchSealed``, instead of a
        filter that silently matches nothing."""
        assert main(["events", "tail", "--url", sqlite_url, "--type", "BatchSealed"]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert "'BatchSealed'" in err and "did you mean vm.BatchSealed?" in err
        assert len(err.splitlines()) == 1

    def test_a_registered_type_filters(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        appended(sqlite_url, NewEvent("vm.BatchSealed", {"n": 1}), NewEvent("Other", {"n": 2}))
        assert main(["events", "tail", "--url", sqlite_url, "--type", "vm.BatchSealed"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert len(out) == 1 and "vm.BatchSealed" in out[0]

    def test_limit_counts_the_events_of_the_type(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Without --after, --type with --limit N prints the last N events of that type, however
        far back in the log they are."""
        sealed = [NewEvent("vm.BatchSealed", {"n": n}) for n in range(3)]
        appended(sqlite_url, *sealed, *[NewEvent("Other", {"n": n}) for n in range(50)])
        argv = ["events", "tail", "--url", sqlite_url, "--type", "vm.BatchSealed", "--limit", "2"]
        assert main([*argv, "--json"]) == 0
        printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [event["data"]["n"] for event in printed] == [1, 2]

    def test_a_type_only_in_the_log_still_filters(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Events appended through the library under names of their own stay reachable."""
        appended(sqlite_url, NewEvent("Tested", {"n": 1}), NewEvent("Other", {"n": 2}))
        assert main(["events", "tail", "--url", sqlite_url, "--type", "Tested", "--json"]) == 0
        [line] = capsys.readouterr().out.splitlines()
        assert json.loads(line)["type"] == "Tested"


class TestCloseMatches:
    def test_the_same_event_name_in_every_context(self) -> None:
        known = ["ipam.NodeJoined", "nodes.NodeJoined", "vm.BatchSealed"]
        assert close_matches("nodejoined", known) == ["ipam.NodeJoined", "nodes.NodeJoined"]

    def test_misspellings(self) -> None:
        assert close_matches("vm.BatchSeald", ["vm.BatchSealed", "vm.BatchOpened"])[0] == (
            "vm.BatchSealed"
        )

    def test_nothing_close(self) -> None:
        assert close_matches("zzz", ["vm.BatchSealed"]) == []
