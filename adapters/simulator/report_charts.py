"""The charts of the all-capabilities report, drawn with matplotlib as inline SVG.

Each chart is drawn from the report's series (read from the logs) and the scenarios' own
comparisons, never from figures recomputed here. The SVG is deterministic — the same report gives
the same bytes: matplotlib's ids are hashed with a fixed salt (one per chart, so the ids of two
charts in one page differ), no date or creator is written, and text stays text (``svg.fonttype
= none``: the page renders it in its own font, and it stays searchable).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .all import AllReport
from .report_series import Series
from .subnet import POLICIES

__all__ = ["Chart", "draw_charts"]

_OURS = "#1f6fb2"
_NAIVE = "#d1495b"
_SEED = "#edae49"
_CAPACITY = "#555555"
_MINIMUM = "#66a182"
_REASONS = {"full": "#1f6fb2", "idle": "#66a182", "max": "#edae49", "skip": "#d1495b"}


@dataclass(frozen=True, slots=True)
class Chart:
    """One drawn chart: its id in the page, title, what it shows, and the SVG markup."""

    name: str
    title: str
    caption: str
    svg: str


def draw_charts(report: AllReport) -> tuple[Chart, ...]:
    """Every chart of the report, in page order."""
    drawers: Sequence[tuple[str, str, str, Callable[[Figure, AllReport], None]]] = (
        (
            "batch-sizes",
            "Batch sizes over time (burst-vms)",
            "Each dot is one sealed batch of VM requests: its size and when it was sealed, "
            "coloured by why (full, idle timeout, max timeout, or a request that skips batching).",
            _batch_sizes,
        ),
        (
            "cloud-calls",
            "Cloud calls vs requests (burst-vms)",
            "Cumulative VM requests — the cloud calls a naive controller makes, one per request "
            "— against the create calls the batches made.",
            _cloud_calls,
        ),
        (
            "workers",
            "Workers asked for (burst-workloads)",
            "Workers requested per burst by the batch placer and by the naive placer, against "
            "the bin-packing minimum.",
            _workers,
        ),
        (
            "node-reservations",
            "Node reservations vs capacity (restart)",
            "The fleet's CPU reserved (buffer included) and held as buffer, against what the "
            "nodes can reserve (total − system), folded from the log; the controller is down "
            "between the dashed lines.",
            _node_reservations,
        ),
        (
            "subnet",
            "Subnet utilization and batch size (subnet)",
            "IPs handed to nodes as a share of the subnet, and the batch size the subnet asked "
            "for, from the settled policy's log; right: how often each policy changed its batch "
            "size (oscillation), in all and at steady demand.",
            _subnet,
        ),
        (
            "slot-occupancy",
            "Testbed slot occupancy (testbed)",
            "Slots held by a job's pod against the testbed's slots, and slots held by two pods "
            "at once (must stay 0).",
            _slots,
        ),
        (
            "buffer-after-restart",
            "Buffer after restart: ours vs the seed's rule (restart)",
            "Capacity held back as buffer right after the restart, under our log-bound rule "
            "and the seed's assume-max rule; right: our buffer over time until every agent "
            "reported.",
            _buffer,
        ),
    )
    return tuple(
        Chart(name, title, caption, _svg(name, _bind(draw, report)))
        for name, title, caption, draw in drawers
    )


def _bind(draw: Callable[[Figure, AllReport], None], report: AllReport) -> Callable[[Figure], None]:
    def bound(figure: Figure) -> None:
        draw(figure, report)

    return bound


def _svg(name: str, draw: Callable[[Figure], None]) -> str:
    """Draw into a fresh figure and return its SVG element (no XML prolog, no DOCTYPE)."""
    # A bare Figure (no pyplot): no global figure registry, no GUI backend, nothing to close.
    with matplotlib.rc_context(
        {
            "svg.hashsalt": f"fleetledger-{name}",
            "svg.fonttype": "none",
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    ):
        figure = Figure(figsize=(8.0, 3.2), layout="constrained")
        draw(figure)
        out = io.StringIO()
        figure.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    text = out.getvalue()
    return text[text.index("<svg") :]


def _series(report: AllReport, name: str) -> Series:
    return report.series[name]


def _batch_sizes(figure: Figure, report: AllReport) -> None:
    ax = figure.add_subplot()
    batches = _series(report, "batch_sizes")
    times, sizes, reasons = (
        batches.numbers("t_s"),
        batches.numbers("batch_size"),
        batches.column("seal_reason"),
    )
    for reason in sorted(set(map(str, reasons))):
        picked = [i for i, r in enumerate(reasons) if r == reason]
        ax.scatter(
            [times[i] for i in picked],
            [sizes[i] for i in picked],
            s=22,
            color=_REASONS.get(reason, _CAPACITY),
            label=reason,
        )
    ax.axhline(report.burst_vms.max_batch_size, color=_CAPACITY, linestyle="--", linewidth=1)
    ax.annotate(
        "max batch size",
        (0, report.burst_vms.max_batch_size),
        xytext=(2, 3),
        textcoords="offset points",
        color=_CAPACITY,
    )
    ax.set_ylim(0, report.burst_vms.max_batch_size * 1.3)
    _label(ax, "virtual seconds", "requests in the batch")
    ax.legend(title="sealed because", loc="upper right", ncols=4, frameon=False)


def _cloud_calls(figure: Figure, report: AllReport) -> None:
    ax = figure.add_subplot()
    calls = _series(report, "cloud_calls")
    t = calls.numbers("t_s")
    ax.step(t, calls.numbers("requests"), where="post", color=_NAIVE, label="requests (naive)")
    ax.step(t, calls.numbers("cloud_calls"), where="post", color=_OURS, label="batched calls")
    _label(ax, "virtual seconds", "cumulative calls")
    ax.legend(loc="upper left", frameon=False)


def _workers(figure: Figure, report: AllReport) -> None:
    ax = figure.add_subplot()
    ours = report.placement.phases
    naive = report.placement.naive or ()
    names = [p.name for p in ours]
    x = list(range(len(names)))
    width = 0.27
    bars = (
        ([i - width for i in x], [p.workers_requested for p in ours], _OURS, "batch placer"),
        (x, [p.workers_requested for p in naive], _NAIVE, "naive placer"),
        (
            [i + width for i in x],
            [p.bin_packing_minimum for p in ours],
            _MINIMUM,
            "bin-packing minimum",
        ),
    )
    for where, heights, colour, label in bars:
        ax.bar_label(ax.bar(where, heights, width, color=colour, label=label), padding=2)
    ax.set_xticks(x, [f"{name} burst" for name in names])
    ax.set_ylim(0, max((max(h, default=0) for _, h, _, _ in bars), default=0) * 1.3 + 1)
    _label(ax, "", "workers requested")
    ax.legend(loc="upper left", frameon=False)


def _node_reservations(figure: Figure, report: AllReport) -> None:
    ax = figure.add_subplot()
    node = _series(report, "node_reservations")
    t = node.numbers("t_s")
    cores = [v / 1000 for v in node.numbers("cpu_reserved_milli")]
    buffer = [v / 1000 for v in node.numbers("cpu_buffer_milli")]
    capacity = [v / 1000 for v in node.numbers("cpu_reservable_milli")]
    ax.step(t, capacity, where="post", color=_CAPACITY, label="reservable (total − system)")
    ax.step(t, cores, where="post", color=_OURS, label="reserved")
    ax.fill_between(t, buffer, step="post", color=_SEED, alpha=0.6, label="of which buffer")
    _restart_marks(ax, report)
    ax.set_ylim(bottom=0)
    _label(ax, "virtual seconds", "CPU cores (whole fleet)")
    ax.legend(loc="lower right", frameon=False, ncols=3)


def _subnet(figure: Figure, report: AllReport) -> None:
    left, right = figure.subplots(1, 2, width_ratios=(2.3, 1))
    subnet = _series(report, "subnet")
    t = subnet.numbers("t_s")
    left.step(
        t,
        [u * 100 for u in subnet.numbers("utilization")],
        where="post",
        color=_OURS,
        label="utilization",
    )
    left.set_ylim(0, 100)
    _label(left, "virtual seconds", "% of the subnet's IPs held")
    batch = left.twinx()
    batch.spines["right"].set_visible(True)
    batch.step(t, subnet.numbers("batch_size"), where="post", color=_SEED, label="batch size")
    batch.set_ylabel("batch size (IPs)")
    batch.yaxis.set_major_locator(MaxNLocator(integer=True))
    batch.set_ylim(0, max(subnet.numbers("batch_size"), default=0) * 1.25 + 1)
    handles = [*left.get_legend_handles_labels()[0], *batch.get_legend_handles_labels()[0]]
    left.legend(handles=handles, loc="lower center", ncols=2, frameon=False)
    policies = report.subnet.policies
    names = POLICIES  # naive, formula, settled: the order of the tick labels below
    x = list(range(len(names)))
    every = [policies[n].batch_changes for n in names]
    steady = [policies[n].steady_batch_changes for n in names]
    right.bar_label(
        right.bar([i - 0.2 for i in x], every, 0.4, color=_NAIVE, label="all"), padding=2
    )
    right.bar_label(
        right.bar([i + 0.2 for i in x], steady, 0.4, color=_SEED, label="at steady demand"),
        padding=2,
    )
    right.set_xticks(x, ["naive", "seed's\nformula", "ours"])
    right.set_ylim(0, max(every, default=0) * 1.35 + 1)
    _label(right, "", "batch size changes")
    right.legend(loc="upper right", frameon=False)


def _slots(figure: Figure, report: AllReport) -> None:
    ax = figure.add_subplot()
    slots = _series(report, "slot_occupancy")
    t = slots.numbers("t_s")
    ax.step(t, slots.numbers("slots_total"), where="post", color=_CAPACITY, label="testbed slots")
    ax.step(t, slots.numbers("slots_held"), where="post", color=_OURS, label="held by a pod")
    ax.step(
        t, slots.numbers("slots_double_held"), where="post", color=_NAIVE, label="held by two pods"
    )
    ax.set_ylim(0, max(slots.numbers("slots_total"), default=0) * 1.35 + 1)
    _label(ax, "virtual seconds", "slots")
    ax.legend(loc="upper right", frameon=False, ncols=3)


def _buffer(figure: Figure, report: AllReport) -> None:
    left, right = figure.subplots(1, 2, width_ratios=(1, 1.6))
    ours, seeds = report.restart.log_bound, report.restart.assume_max
    labels = ["CPU cores", "memory slots"]
    x = [0, 1]
    left.bar(
        [i - 0.2 for i in x],
        [ours.buffer_cpu_milli / 1000, ours.buffer_memory_slots],
        0.4,
        color=_OURS,
        label="ours (last logged permit)",
    )
    left.bar(
        [i + 0.2 for i in x],
        [seeds.buffer_cpu_milli / 1000, seeds.buffer_memory_slots],
        0.4,
        color=_SEED,
        label="seed's rule (assume max)",
    )
    for container in left.containers:
        left.bar_label(container, padding=2, fmt="%g")
    left.set_xticks(x, labels)
    top = max(seeds.buffer_cpu_milli / 1000, seeds.buffer_memory_slots, 1)
    left.set_ylim(0, top * 1.3)
    _label(left, "", "buffer right after restart")
    left.legend(loc="upper left", frameon=False)
    node = _series(report, "node_reservations")
    t = node.numbers("t_s")
    right.step(
        t,
        [v / 1000 for v in node.numbers("cpu_buffer_milli")],
        where="post",
        color=_OURS,
        label="our buffer",
    )
    right.axhline(
        seeds.buffer_cpu_milli / 1000, color=_SEED, linestyle="--", label="seed's rule, at takeover"
    )
    _restart_marks(right, report)
    right.set_ylim(bottom=0)
    _label(right, "virtual seconds", "CPU cores held as buffer")
    right.legend(loc="upper left", frameon=False)


def _restart_marks(ax: Axes, report: AllReport) -> None:
    settings = report.restart.settings
    down = settings.restart_at_seconds
    up = down + settings.downtime_seconds
    for at in (down, up):
        ax.axvline(at, color=_CAPACITY, linestyle=":", linewidth=1)


def _label(ax: Axes, x: str, y: str) -> None:
    if x:
        ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
