"""The ipam adapters' surface: one error tree at the boundary."""

from __future__ import annotations

import fleetledger.adapters.ipam as package


class TestSurface:
    def test_every_error_is_an_ipam_error(self) -> None:
        """Callers handle one tree."""
        errors = (
            package.AllocatorUnavailable,
            package.CommandRejected,
            package.InvalidIpamCommand,
            package.LogContention,
            package.LogUnavailable,
            package.NotLeader,
            package.UnknownSubnet,
        )
        assert all(issubclass(e, package.IpamError) for e in errors)
