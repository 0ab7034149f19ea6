"""The package's exported surface changes only on purpose."""

from __future__ import annotations

from fleetledger.adapters import machines


class TestSurface:
    def test_exports(self) -> None:
        """``machines.__all__`` is exactly the documented API, all importable."""
        assert sorted(machines.__all__) == [
            "Accepted",
            "BatchMetadata",
            "BatchStalled",
            "CLOUD_KINDS",
            "CloudChoice",
            "CloudNotConfigured",
            "Coordinator",
            "CoordinatorOptions",
            "DEFAULT_GROUPER",
            "DispatchMode",
            "GrouperDriver",
            "InlineRunner",
            "InvalidRequest",
            "LogContention",
            "LogUnavailable",
            "MachineOutcome",
            "MachineRequest",
            "MachineService",
            "Machines",
            "MachinesError",
            "MachinesRuntime",
            "RequestRejected",
            "RetryPolicy",
            "RuntimeStopped",
            "TaskRunner",
            "ThreadRunner",
            "UnknownRequest",
            "batch_stream_id",
            "build_cloud",
            "current_batch",
            "grouper_stream_id",
            "should_skip_batching",
            "skip_batching",
        ]
        assert all(hasattr(machines, name) for name in machines.__all__)
