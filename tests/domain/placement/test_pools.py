"""Reasons the pools give for a workload none accepts: recorded in the log, so bounded however
large or odd the client's text."""

from __future__ import annotations

from fleetledger.domain.placement import Pool, WorkloadRequest, never_fits
from fleetledger.domain.template import MachineTemplate

POOL = Pool(
    name="cpu",
    template=MachineTemplate(vm_size="Standard_D4s_v5"),
    worker_cpu_milli=4000,
    worker_memory_bytes=16 << 30,
)


def rejected(**fields: object) -> str:
    request = WorkloadRequest(id="w", cpu_milli=1000, memory_bytes=1 << 30, **fields)  # type: ignore[arg-type]
    reason = never_fits(request, [POOL])
    assert reason is not None
    return reason


class TestNoPoolAccepts:
    def test_a_short_selector_is_named_as_given(self) -> None:
        """The common case reads as before: the selector, plain."""
        assert "(selector gpu, no GPU, not preemptible)" in rejected(selector="gpu")

    def test_a_megabyte_selector_is_quoted_by_its_start_and_length(self) -> None:
        """A reason never holds the whole of a huge selector, only enough to recognise it."""
        reason = rejected(selector="s" * 1_000_000)
        assert "(1000000 characters)" in reason
        assert len(reason) < 400

    def test_control_characters_are_escaped(self) -> None:
        """A NUL (which Postgres cannot store in text) is shown escaped, never as itself."""
        reason = rejected(selector="a\x00b")
        assert "selector 'a\\x00b'" in reason
        assert "\x00" not in reason

    def test_a_long_list_of_gpu_types_is_cut_too(self) -> None:
        """The GPU types a workload lists are client text as well."""
        reason = rejected(gpu=1, gpu_types=tuple(f"type-{i}" for i in range(10_000)))
        assert "characters)" in reason
        assert len(reason) < 400
