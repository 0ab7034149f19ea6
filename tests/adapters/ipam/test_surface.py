"""The package's public surface changes only on purpose."""

from __future__ import annotations

import fleetledger.adapters.ipam as package


class TestSurface:
    def test_exports(self) -> None:
        """``__all__`` lists exactly the names callers may rely on, each importable."""
        assert sorted(package.__all__) == sorted(
            [
                "SUBNET_CODEC",
                "SUBNET_EVENT_TYPE_NAMES",
                "AllocatorUnavailable",
                "CommandRejected",
                "InMemoryAllocator",
                "InvalidIpamCommand",
                "IpAllocator",
                "IpamError",
                "IpamRuntime",
                "LogContention",
                "LogUnavailable",
                "NotLeader",
                "QueuedRunner",
                "SubnetReactions",
                "SubnetService",
                "SubnetStream",
                "UnknownSubnet",
                "subnet_aggregate",
                "subnet_id_of",
                "subnet_stream_id",
            ]
        )
        assert all(hasattr(package, name) for name in package.__all__)

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
