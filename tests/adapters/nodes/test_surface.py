"""The node packages' exported surfaces change only on purpose."""

from __future__ import annotations

from fleetledger.adapters import kubernetes, nodes


class TestSurface:
    def test_nodes_exports(self) -> None:
        """``nodes.__all__`` is exactly the documented API, all importable."""
        assert sorted(nodes.__all__) == [
            "BadAnnotation",
            "ClusterSync",
            "DEFAULT_NODE_CONFIG",
            "FakeMigrations",
            "Grant",
            "InvalidRequest",
            "LogContention",
            "LogUnavailable",
            "MigratingPodMismatch",
            "Migrations",
            "NODE_CODEC",
            "NODE_EVENT_TYPES",
            "NodeService",
            "NodesError",
            "NodesRuntime",
            "RequestRefused",
            "RuntimeStopped",
            "SyncReport",
            "UnknownPod",
            "migration_reactor",
            "node_aggregate",
            "node_of_stream",
            "pod_spec",
            "vm_annotations",
        ]
        assert all(hasattr(nodes, name) for name in nodes.__all__)

    def test_kubernetes_exports(self) -> None:
        """``kubernetes.__all__`` is the adapter, its informer and the conversions."""
        assert sorted(kubernetes.__all__) == [
            "Informer",
            "KubernetesCluster",
            "node_from",
            "pod_from",
        ]
        assert all(hasattr(kubernetes, name) for name in kubernetes.__all__)

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
