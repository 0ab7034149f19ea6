"""The node packages' surfaces: one error tree at the boundary."""

from __future__ import annotations

from fleetledger.adapters import nodes


class TestSurface:
    def test_every_node_error_is_a_nodes_error(self) -> None:
        """One tree at the boundary: each error the package raises derives from NodesError."""
        for error in (
            nodes.InvalidRequest,
            nodes.UnknownPod,
            nodes.MigratingPodMismatch,
            nodes.RequestRefused,
            nodes.LogUnavailable,
            nodes.LogContention,
            nodes.RuntimeStopped,
        ):
            assert issubclass(error, nodes.NodesError)
