"""ShortThreadSwitches: a shorter switch interval while it runs, the old one after."""

from __future__ import annotations

import sys

from fleetledger.adapters.switching import SWITCH_INTERVAL_SECONDS, ShortThreadSwitches


def test_the_interval_is_shortened_while_running_and_restored_after() -> None:
    before = sys.getswitchinterval()
    switches = ShortThreadSwitches()
    switches.start()
    try:
        assert sys.getswitchinterval() == min(before, SWITCH_INTERVAL_SECONDS)
    finally:
        switches.stop()
    assert sys.getswitchinterval() == before


def test_a_shorter_interval_already_set_is_kept() -> None:
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS / 2)
    switches = ShortThreadSwitches()
    try:
        switches.start()
        assert sys.getswitchinterval() == SWITCH_INTERVAL_SECONDS / 2
        switches.stop()
    finally:
        sys.setswitchinterval(before)
