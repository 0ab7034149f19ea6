"""Pod-IP batch sizing for one subnet: the seed's formula, its settled form, pools, exhaustion.

Seed 03 sizes the batch of IPs a node requests from its subnet (capacity ``C``, ``N`` nodes,
``U`` IPs allocated) as::

    β = ⌊log2(X_ssf·C / (X_nsf·N))⌋    λ = log2((C − U) / N)    γ = ⌈β − λ⌉ − du    B = 2^(β − γ)

with ``du = 1`` while utilization falls. The seed's two safety factors are both offered: the node
safety factor ``X_nsf ≥ 1`` (``x_nsf``, 2 by default) keeps ``(X_nsf − 1)·N`` batches' worth of
the subnet free so that any node can take one more batch, and the subnet safety factor
``0 < X_ssf ≤ 1`` (``x_ssf``, 1 by default) hands only that fraction of the subnet out as
batches, keeping the rest for other users of the subnet (NAT gateways, load balancers, VMs
created out of band).

Because ``β`` is an integer, ``β − ⌈β − λ⌉ = ⌊λ⌋``: the rising branch is "the largest power of
two a node could take again from what is left" and the falling branch one doubling more.
:func:`batch_size` computes exactly that, in exact integer arithmetic (no float ``log2``
rounding at the powers of two), clamped to ``[1, 2^β]``.

**The formula does not settle in closed loop.** What a node holds depends on ``B`` (its pool is
``B·⌈buffer + demand/B⌉``), so ``U`` is an effect of the batch, and feeding the formula its own
result cycles: ``C = 1024``, 28 nodes each using 20 IPs, buffer 0.5 — ``B = 16`` holds 896 IPs,
so ``B = 4``; that holds 672 (falling), so ``B = 16`` again, for ever. The seed's claim that the
falling shift prevents cycles does not survive the feedback.

**The settled rule** (:func:`subnet_batch_size`) keeps the formula's test but applies it to the
utilization that each candidate batch would itself cause, instead of the utilization the last
batch caused. For per-node demands ``d_1..d_N`` (IPs in use), let::

    pool(d, b) = min(b·⌈buffer + d/b⌉, max_ips)            what a node holds at batch b
    A(b)       = Σ pool(d_i, b) + N·b                      those pools plus one more batch each

The formula's rising test ``b ≤ (C − U)/N`` with ``U = Σ pool(d_i, b)`` is ``A(b) ≤ C``. The rule:
``B`` is the largest power of two ``b`` in ``[1, 2^β]`` with ``A(b) ≤ C``, and 1 if there is none.

**Clamped to the node maximum.** A node never holds more than ``m_i = min(its own maximum,
max_ips)`` IPs, ``max_ips ≤ 250`` (a node runs at most 250 pods), so a batch above ``m_i`` means
nothing to it: node ``i`` uses ``b_i = min(b, m_i)``, and the rule above reads
``A(b) = Σ pool_i(d_i, b_i) + Σ b_i`` with ``pool_i`` clamped to ``m_i``. The batch the rule
returns is clamped to ``[1, max m_i]`` as the original clamps its scaler's batch to
``[1, maxIPCount]`` (Azure CNS ``clampScaler``) — a /16 with one node gets 250, not 2^15. All
maxima equal to ``max_ips`` and no clamp active is the rule as first stated.

*Proof of its properties.*

1. ``A`` never decreases as ``b`` doubles. ``b·⌈buffer + d/b⌉`` is the least multiple of ``b`` that
   is at least ``d + buffer·b``. The least multiple of ``2b`` that is at least ``d + buffer·2b``
   is also a multiple of ``b`` and at least ``d + buffer·b`` (buffer ≥ 0), hence not smaller.
   ``min(·, max_ips)`` and ``N·b`` keep the order. Where the clamp starts to act (``b < m_i ≤
   2b``) node ``i`` goes from ``b`` to ``m_i``, whose pool is ``m_i`` itself — the most it can
   hold — unless demand and buffer are both 0 (then every pool is 0); ``b_i`` only grows. So the
   set of passing batches is closed downwards: scanning from ``2^β`` down, the first that passes
   is the largest.
2. ``A`` never decreases when a demand grows (a ceiling of a growing value, clamped), nor when a
   node is added (one more non-negative pool, ``N·b`` grows, and ``β`` can only fall).
3. *Power of two in* ``[1, 2^β]``: by construction (``B = 1`` when ``2^β < 1``).
4. *Same demands, same batch*: ``B`` is a function of ``(C, demands)`` and the configuration only.
   Utilization and the previous batch do not enter, so a controller that recomputes it after its
   own allocations land gets the same answer: no feedback, hence no cycle.
5. *More demand never gives a larger batch*: by 2, every ``b`` that passes for the larger demands
   passes for the smaller ones, so the largest passing one cannot grow.
6. *The allocations fit whenever they fit at* ``B = 1``: if ``B > 1`` then
   ``Σ pool_i(d_i, b_i) = A(B) − Σ b_i ≤ C − Σ b_i < C`` (with room for one more batch per node,
   the headroom ``X_nsf`` intends); if ``B = 1`` the allocations are those at ``B = 1``.

The exhaustion flag (:func:`next_exhausted`) adds hysteresis around a utilization. The Subnet
aggregate feeds it the *floor*, ``Σ pool(d_i, 1)`` at buffer 1 — what the subnet must hold
whatever the batch — never the IPs allocated: the allocated count is an effect of the flag
(exhausted means ``B = 1``), which is exactly the loop the seed describes for 28+ nodes on a /22.

Edges the raw formula leaves open, as defined here:

* **no nodes**: sized as for one node (the batch the first node to join would get);
* ``used ≥ capacity``: 1 (nothing left to hand out; a node still gets one IP at a time);
* ``C/(X·N) < 1`` (``β < 0``): 1 — the clamp's lower bound wins over ``2^β``;
* **non-integer counts**: capacity, nodes, used and demands are counts of addresses and nodes,
  so anything but an ``int`` (including ``bool`` and whole floats) is refused with
  :class:`InvalidCommand`; round at the caller. ``x_nsf``, ``x_ssf`` and ``buffer`` are real
  numbers, used exactly (``Fraction``), so ``2.0`` and ``2`` give the same answers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

from fleetledger.domain.errors import InvalidCommand

__all__ = [
    "BATCH_EXPONENTS",
    "DEFAULT_BUFFER",
    "DEFAULT_LOWER_THRESHOLD",
    "DEFAULT_MAX_IPS",
    "DEFAULT_UPPER_THRESHOLD",
    "DEFAULT_X_NSF",
    "DEFAULT_X_SSF",
    "MAX_IPS_LIMIT",
    "batch_ceiling",
    "batch_size",
    "batch_terms",
    "check_max_ips",
    "crossed",
    "exact_pool_size",
    "floor_term",
    "next_exhausted",
    "plan_release",
    "pool_size",
    "settled_batch",
    "subnet_batch_size",
    "subnet_floor",
]

DEFAULT_X_NSF = 2.0
DEFAULT_X_SSF = 1.0
DEFAULT_BUFFER = 0.5
MAX_IPS_LIMIT = 250
"""The most pod IPs any node may hold: Azure CNI runs at most 250 pods per node."""
DEFAULT_MAX_IPS = MAX_IPS_LIMIT
DEFAULT_UPPER_THRESHOLD = 0.9
DEFAULT_LOWER_THRESHOLD = 0.5


# -- validation ----------------------------------------------------------------------------------


def _count(name: str, value: object, *, minimum: int) -> int:
    if type(value) is not int:
        raise InvalidCommand(
            f"{name} is a count and must be an integer, got {value!r}; round it before asking"
        )
    if value < minimum:
        raise InvalidCommand(f"{name} must be at least {minimum}, got {value}")
    return value


def _real(name: str, value: object, *, minimum: float, hint: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidCommand(f"{name} must be a finite number ({hint}), got {value!r}")
    if value < minimum:
        raise InvalidCommand(f"{name} must be at least {minimum:g} ({hint}), got {value!r}")
    return _exact(value)


@functools.lru_cache(maxsize=64)
def _exact(value: float) -> Fraction:
    # The same few settings are converted on every decision; a float's exact Fraction is slow.
    return Fraction(value)


def _x_nsf(value: object) -> Fraction:
    return _real("x_nsf", value, minimum=1.0, hint="the node safety factor, 2 by default")


def _x_ssf(value: object) -> Fraction:
    hint = "the fraction of the subnet handed out as batches, 1 by default"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= 1
    ):
        raise InvalidCommand(
            f"x_ssf (the subnet safety factor) must be a number in (0, 1] ({hint}), got {value!r}"
        )
    return _exact(value)


def check_max_ips(name: str, value: object) -> int:
    """``value`` as a node's maximum IP count: an integer in ``[1, 250]``; ``name`` says which
    setting it is in the error."""
    if type(value) is not int or not 1 <= value <= MAX_IPS_LIMIT:
        raise InvalidCommand(
            f"{name} must be an integer between 1 and {MAX_IPS_LIMIT} (the pod IPs one node may "
            f"hold; a node runs at most {MAX_IPS_LIMIT} pods), got {value!r}"
        )
    return value


def _buffer(value: object) -> Fraction:
    return _real("buffer", value, minimum=0.0, hint="the request threshold, 0.5 by default")


# -- exact powers of two -------------------------------------------------------------------------

_ONE = Fraction(1)


def _floor_log2(x: Fraction) -> int:
    """``⌊log2 x⌋`` for ``x > 0``, exactly."""
    # 2^(a-1) <= numerator < 2^a and 2^(b-1) <= denominator < 2^b, so x lies in
    # (2^(a-b-1), 2^(a-b+1)) and its floor log2 is a-b or a-b-1.
    k = x.numerator.bit_length() - x.denominator.bit_length()
    return k if Fraction(2) ** k <= x else k - 1


def _beta(capacity: int, nodes: int, x_nsf: Fraction, x_ssf: Fraction = _ONE) -> int:
    return _floor_log2(x_ssf * capacity / (x_nsf * max(nodes, 1)))


def batch_ceiling(
    capacity: int, nodes: int, *, x_nsf: float = DEFAULT_X_NSF, x_ssf: float = DEFAULT_X_SSF
) -> int:
    """``2^β`` clamped to at least 1: the largest power of two any rule may give ``nodes``
    nodes (before the clamp to the node maximum)."""
    _count("capacity", capacity, minimum=1)
    _count("nodes", nodes, minimum=0)
    return 1 << max(_beta(capacity, nodes, _x_nsf(x_nsf), _x_ssf(x_ssf)), 0)


# -- the seed's formula --------------------------------------------------------------------------


def batch_size(
    capacity: int,
    nodes: int,
    used: int,
    *,
    falling: bool,
    x_nsf: float = DEFAULT_X_NSF,
    x_ssf: float = DEFAULT_X_SSF,
) -> int:
    """The seed's batch ``2^(β−γ)`` for ``used`` of ``capacity`` IPs over ``nodes`` nodes.

    ``falling`` is ``du``: utilization fell since the last evaluation. The result is clamped to
    ``[1, 2^β]``; the edges are defined in the module docstring. Open loop only: fed its own
    allocations it cycles — use :func:`subnet_batch_size` to decide.
    """
    _count("capacity", capacity, minimum=1)
    _count("nodes", nodes, minimum=0)
    _count("used", used, minimum=0)
    beta = _beta(capacity, nodes, _x_nsf(x_nsf), _x_ssf(x_ssf))
    free = capacity - used
    if beta < 0 or free <= 0:
        return 1
    # β − ⌈β − λ⌉ = ⌊λ⌋ because β is an integer; du shifts one power up.
    k = _floor_log2(Fraction(free, max(nodes, 1))) + (1 if falling else 0)
    return 1 << max(min(k, beta), 0)


# -- pools ---------------------------------------------------------------------------------------


def pool_size(
    demand: int,
    batch: int,
    *,
    buffer: float = DEFAULT_BUFFER,
    max_ips: int = DEFAULT_MAX_IPS,
) -> int:
    """IPs a node using ``demand`` should hold: ``batch·⌈buffer + demand/batch⌉``, at most
    ``max_ips``. An exhausted subnet asks with ``batch=1, buffer=1``."""
    _count("demand", demand, minimum=0)
    _count("batch", batch, minimum=1)
    _count("max_ips", max_ips, minimum=1)
    return _pool(demand, batch, _buffer(buffer), max_ips)


def exact_pool_size(demand: int, batch: int, buffer: Fraction, max_ips: int) -> int:
    """:func:`pool_size` on checked inputs with an exact ``buffer``, for callers that checked
    them once (the Subnet aggregate plans a pool on every decision)."""
    return _pool(demand, batch, buffer, max_ips)


def _pool(demand: int, batch: int, buffer: Fraction, max_ips: int) -> int:
    # ⌈p/q + d/b⌉ in integers: ceil((p·b + d·q) / (q·b)). This runs for every node on every
    # decision, and Fraction arithmetic would dominate a subnet's decide.
    p, q = buffer.numerator, buffer.denominator
    return min(batch * -(-(p * batch + demand * q) // (q * batch)), max_ips)


def subnet_floor(
    demands: Iterable[int],
    *,
    max_ips: int = DEFAULT_MAX_IPS,
    node_max_ips: Sequence[int] | None = None,
) -> int:
    """IPs the subnet must hold whatever the batch: every pool at ``B = 1``, buffer 1, each
    clamped to its node's maximum (``node_max_ips``, one per demand, capped at ``max_ips``)."""
    counts = [_count("demand", d, minimum=0) for d in demands]
    maxima = _maxima(len(counts), max_ips, node_max_ips)
    return sum(_pool(d, 1, Fraction(1), m) for d, m in zip(counts, maxima, strict=True))


def _maxima(nodes: int, max_ips: int, node_max_ips: Sequence[int] | None) -> list[int]:
    """Each node's maximum: its own, capped at ``max_ips`` (all ``max_ips`` when ``None``)."""
    _count("max_ips", max_ips, minimum=1)
    if node_max_ips is None:
        return [max_ips] * nodes
    if len(node_max_ips) != nodes:
        raise InvalidCommand(
            f"node_max_ips gives {len(node_max_ips)} maxima for {nodes} nodes; give one per "
            "node, in the order of the demands"
        )
    return [min(_count("node max_ips", m, minimum=1), max_ips) for m in node_max_ips]


def plan_release(
    held: Sequence[str], in_use: Iterable[str], pending: Sequence[str], surplus: int
) -> tuple[str, ...]:
    """Which of the ``held`` IPs (in allocation order) should be pending release for ``surplus``.

    Only IPs not in use can go. IPs already pending stay pending first (a release in progress is
    not reshuffled), then the most recently allocated free ones are added; when the surplus
    shrinks the most recently marked are kept back. The result is in ``held`` order.
    """
    if surplus <= 0:
        return ()
    busy = set(in_use)
    marked = set(pending)
    releasable = [ip for ip in held if ip not in busy]
    already = [ip for ip in releasable if ip in marked]
    fresh = [ip for ip in reversed(releasable) if ip not in marked]
    chosen = set((already + fresh)[:surplus])
    return tuple(ip for ip in held if ip in chosen)


# -- the settled rule ----------------------------------------------------------------------------


def subnet_batch_size(
    capacity: int,
    demands: Sequence[int],
    *,
    buffer: float = DEFAULT_BUFFER,
    x_nsf: float = DEFAULT_X_NSF,
    x_ssf: float = DEFAULT_X_SSF,
    max_ips: int = DEFAULT_MAX_IPS,
    node_max_ips: Sequence[int] | None = None,
) -> int:
    """The largest power of two ``b ≤ 2^β`` whose own pools leave one more batch per node free:
    ``Σ pool_i(d_i, b_i) + Σ b_i ≤ capacity`` with ``b_i = min(b, m_i)``; 1 if none does; then
    clamped to ``[1, max m_i]``. ``demands`` are per-node IPs in use, ``node_max_ips`` each
    node's own maximum (one per demand; ``max_ips`` caps them all and is the maximum of a node
    without one, at most 250).

    Settles by construction (a function of the demands alone); see the module docstring for the
    rule's proof.
    """
    _count("capacity", capacity, minimum=1)
    check_max_ips("max_ips", max_ips)
    fraction_buffer = _buffer(buffer)
    counts = [_count("demand", d, minimum=0) for d in demands]
    maxima = _maxima(len(counts), max_ips, node_max_ips)
    largest = max(maxima, default=max_ips)
    beta = _beta(capacity, len(counts), _x_nsf(x_nsf), _x_ssf(x_ssf))
    # From 2^top up every node is clamped to its maximum, so A no longer changes: start there.
    top = min(beta, (largest - 1).bit_length())
    for k in range(top, 0, -1):
        b = 1 << k
        held = 0
        for d, m in zip(counts, maxima, strict=True):
            mine = b if b < m else m
            held += _pool(d, mine, fraction_buffer, m) + mine
        if held <= capacity:
            return b if b < largest else largest
    return 1


BATCH_EXPONENTS = tuple(range(1, MAX_IPS_LIMIT.bit_length() + 1))
"""The exponents ``k`` of every batch ``2^k > 1`` :func:`subnet_batch_size` may try: no node
maximum exceeds 250, so no batch above ``2^8`` is ever tried."""


def batch_terms(demand: int, max_ips: int, buffer: Fraction) -> tuple[int, ...]:
    """One node's share of ``A(2^k)`` for each of :data:`BATCH_EXPONENTS`: its pool at its own
    batch ``min(2^k, max_ips)`` plus that batch. Summed over the nodes (and kept as nodes change)
    they decide the batch with :func:`settled_batch`, as :func:`subnet_batch_size` does."""
    terms = []
    for k in BATCH_EXPONENTS:
        b = 1 << k
        mine = b if b < max_ips else max_ips
        terms.append(_pool(demand, mine, buffer, max_ips) + mine)
    return tuple(terms)


def floor_term(demand: int, max_ips: int) -> int:
    """One node's share of :func:`subnet_floor`: its pool at ``B = 1``, buffer 1."""
    return _pool(demand, 1, _ONE, max_ips)


def settled_batch(
    capacity: int,
    nodes: int,
    largest: int,
    totals: Sequence[int],
    *,
    x_nsf: Fraction,
    x_ssf: Fraction,
) -> int:
    """:func:`subnet_batch_size` from ``totals``, the nodes' :func:`batch_terms` summed, and
    ``largest``, the largest node maximum (the configured one when there are no nodes); the
    inputs are checked and the factors exact already."""
    top = min(_beta(capacity, nodes, x_nsf, x_ssf), (largest - 1).bit_length())
    for k in range(top, 0, -1):
        if totals[k - 1] <= capacity:
            b = 1 << k
            return b if b < largest else largest
    return 1


# -- exhaustion ----------------------------------------------------------------------------------


def next_exhausted(
    exhausted: bool,
    used: int,
    capacity: int,
    *,
    upper: float = DEFAULT_UPPER_THRESHOLD,
    lower: float = DEFAULT_LOWER_THRESHOLD,
) -> bool:
    """The exhaustion flag after seeing ``used`` of ``capacity``: set above ``upper``, cleared
    below ``lower``, unchanged in between."""
    _count("used", used, minimum=0)
    _count("capacity", capacity, minimum=1)
    high = _real("upper", upper, minimum=0.0, hint="a fraction of the subnet, e.g. 0.9")
    low = _real("lower", lower, minimum=0.0, hint="a fraction of the subnet, e.g. 0.5")
    if not low <= high <= 1:
        raise InvalidCommand(
            f"thresholds must satisfy 0 <= lower <= upper <= 1, got lower {lower}, upper {upper}"
        )
    return crossed(exhausted, used, capacity, high=high, low=low)


def crossed(exhausted: bool, used: int, capacity: int, *, high: Fraction, low: Fraction) -> bool:
    """:func:`next_exhausted` on checked inputs and exact thresholds, in integers: the Subnet
    aggregate asks on every decision and has validated its configuration once."""
    if not exhausted:
        return used * high.denominator > high.numerator * capacity
    return not used * low.denominator < low.numerator * capacity
