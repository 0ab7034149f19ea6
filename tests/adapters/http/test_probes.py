"""Checks with a deadline: a probe answers in time whatever the check does."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fleetledger.adapters.http.probes import ProbeTimeout, SingleFlightCheck


class TestSingleFlightCheck:
    def test_a_check_past_the_deadline_is_a_timeout_saying_what(self) -> None:
        """A hung check ends the probe at the deadline with what hangs and for how long."""
        release = threading.Event()
        check = SingleFlightCheck(release.wait, what="reading the head", deadline=0.2)
        started = time.monotonic()
        try:
            with pytest.raises(ProbeTimeout, match=r"reading the head did not finish within 0\.2"):
                asyncio.run(check.run())
        finally:
            release.set()
        assert time.monotonic() - started < 1.0

    def test_probes_during_a_hung_check_join_it(self) -> None:
        """Later probes wait on the run in flight instead of starting another."""
        release = threading.Event()
        calls: list[int] = []

        def hangs() -> bool:
            calls.append(1)
            return release.wait()

        check = SingleFlightCheck(hangs, what="the check", deadline=0.05)

        async def three() -> None:
            for _ in range(3):
                with pytest.raises(ProbeTimeout):
                    await check.run()

        try:
            asyncio.run(three())
        finally:
            release.set()
        assert calls == [1]

    def test_the_result_and_errors_come_through(self) -> None:
        assert asyncio.run(SingleFlightCheck(lambda: 42, what="x").run()) == 42

        def fails() -> int:
            raise LookupError("no")

        with pytest.raises(LookupError):
            asyncio.run(SingleFlightCheck(fails, what="x").run())
