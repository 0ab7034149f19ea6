"""``fleetledger explain ID``: one line per event of the chain, JSON for machines, one line of
error for an id the log does not know."""

from __future__ import annotations

import json

import pytest

from fleetledger.adapters.cli import EXIT_USAGE, main
from fleetledger.adapters.simulator.dst import run_seed
from fleetledger.eventstore import open_store


@pytest.fixture(scope="module")
def seed_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """DST seed 3's log and the worker placement's overflow asked for."""
    url = f"sqlite:///{tmp_path_factory.mktemp('explain-cli') / 'seed3.db'}"
    assert run_seed(3, url=url).ok
    with open_store(url) as store:
        waiting = store.read_all(after=0, types=["placement.WorkloadWaiting"], limit=1)[0]
    return url, waiting.data["worker"]


class TestExplain:
    def test_a_machine_made_through_overflow_prints_its_chain_a_line_an_event(
        self, seed_log: tuple[str, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        url, worker = seed_log

        assert main(["explain", worker, "--url", url]) == 0

        header, *lines = capsys.readouterr().out.splitlines()
        assert header == f"{worker} (machine or node): {len(lines)} events"
        steps = [line.split("[", 1)[1].split("]", 1)[0] for line in lines]
        wanted = [
            "submitted",
            "overflow: waits for a new worker",
            "machine requested",
            "batch sealed",
            "cloud call (dispatched)",
            "created",
            "node joined",
            "placed",
        ]
        assert [s for s in steps if s in wanted] == wanted
        assert all(line.startswith("#") for line in lines)
        assert any(f"request_id=placement-{worker}" in line for line in lines)

    def test_json_gives_every_step_with_its_metadata(
        self, seed_log: tuple[str, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        url, worker = seed_log

        assert main(["explain", f"placement-{worker}", "--url", url, "--json"]) == 0

        report = json.loads(capsys.readouterr().out)
        assert report["id"] == f"placement-{worker}" and report["kinds"] == ["machine request"]
        created = next(s for s in report["steps"] if s["type"] == "vm.MachineCreated")
        assert created["correlation_id"] == f"placement-{worker}"
        assert created["fields"]["machine_name"] == worker
        assert isinstance(created["caused_by"], int) and created["caused_by"] < created["position"]

    def test_an_unknown_id_is_one_line_naming_the_kinds_searched(
        self, seed_log: tuple[str, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        url, _ = seed_log

        assert main(["explain", "nothing-here", "--url", url]) == EXIT_USAGE

        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1
        assert "'nothing-here'" in err and "machine request, workload, batch" in err
