"""Batch sizing rules: the seed's formula, pools, exhaustion, and the settled rule's proof."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fleetledger.domain.errors import InvalidCommand
from fleetledger.domain.ipam import (
    batch_ceiling,
    batch_size,
    next_exhausted,
    plan_release,
    pool_size,
    subnet_batch_size,
    subnet_floor,
)

capacities = st.integers(min_value=1, max_value=1 << 20)
demand_lists = st.lists(st.integers(min_value=0, max_value=600), max_size=120)
buffers = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0])
x_factors = st.sampled_from([1.0, 1.5, 2.0, 3.0, 4.0, 8.0])
max_ipss = st.integers(min_value=1, max_value=250)


def _go_formula(c: float, x: float, n: float, u: float, du: float) -> float:
    """The seed's Go function, transcribed: floats and all."""
    beta = math.floor(math.log2(c / (x * n)))
    lam = math.log2((c - u) / n)
    gamma = math.ceil(beta - lam) - du
    return float(2 ** (beta - gamma))


def _allocations(demands: list[int], batch: int, buffer: float, max_ips: int) -> int:
    return sum(pool_size(d, batch, buffer=buffer, max_ips=max_ips) for d in demands)


class TestBatchSize:
    @pytest.mark.parametrize(
        ("capacity", "x_nsf", "nodes", "used", "falling", "expected"),
        [
            (1024, 2.0, 16, 768, False, 16),
            (1024, 2.0, 16, 768, True, 32),
            (1024, 2.0, 28, 600, False, 8),
            (1024, 2.0, 28, 600, True, 16),
        ],
    )
    def test_worked_values(
        self, *, capacity: int, x_nsf: float, nodes: int, used: int, falling: bool, expected: int
    ) -> None:
        """The issue's worked values (C, X, N, U, falling → B) come out of the formula."""
        assert batch_size(capacity, nodes, used, falling=falling, x_nsf=x_nsf) == expected

    def test_clamped_to_two_to_the_beta(self) -> None:
        """An empty subnet makes the raw formula return 2^(β+1); the clamp gives 2^β."""
        assert _go_formula(1024, 2, 16, 0, 0) == 64
        assert batch_size(1024, 16, 0, falling=False) == 32

    def test_fraction_clamped_to_one(self) -> None:
        """Less than one IP per node left makes the raw formula fractional; the answer is 1."""
        assert _go_formula(1024, 2, 16, 1020, 0) < 1
        assert batch_size(1024, 16, 1020, falling=False) == 1

    def test_no_nodes_sized_as_one(self) -> None:
        """With no nodes the batch is the one the first node to join would get."""
        assert batch_size(1024, 0, 0, falling=False) == batch_size(1024, 1, 0, falling=False)
        assert batch_size(1024, 0, 0, falling=False) == 512

    @pytest.mark.parametrize("used", [1024, 1025, 5000])
    def test_full_subnet_gives_one(self, used: int) -> None:
        """``used ≥ capacity`` (no log of a non-positive number) gives one IP at a time."""
        assert batch_size(1024, 16, used, falling=True) == 1

    def test_more_nodes_than_capacity_allows(self) -> None:
        """``C/(X·N) < 1`` makes β negative; the clamp's lower bound wins."""
        assert batch_size(16, 10, 0, falling=True) == 1
        assert batch_ceiling(16, 10) == 1

    @pytest.mark.parametrize(
        ("capacity", "nodes", "used"),
        [(1024.0, 16, 0), (1024, 16.5, 0), (1024, 16, 3.5), (True, 16, 0), (1024, 16, "0")],
    )
    def test_non_integer_counts_refused(
        self, capacity: object, nodes: object, used: object
    ) -> None:
        """Counts of addresses and nodes must be integers; anything else says to round first."""
        with pytest.raises(InvalidCommand, match="integer"):
            batch_size(capacity, nodes, used, falling=False)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("capacity", "nodes", "used"), [(0, 1, 0), (1024, -1, 0), (1024, 1, -1)]
    )
    def test_out_of_range_counts_refused(self, capacity: int, nodes: int, used: int) -> None:
        """A subnet has at least one IP; nodes and used are never negative."""
        with pytest.raises(InvalidCommand, match="at least"):
            batch_size(capacity, nodes, used, falling=False)

    @pytest.mark.parametrize("x_nsf", [0.5, 0.0, -2.0, math.nan, math.inf, True])
    def test_bad_safety_factor_refused(self, x_nsf: float) -> None:
        """The node safety factor is a finite number of at least 1."""
        with pytest.raises(InvalidCommand, match="x_nsf"):
            batch_size(1024, 16, 0, falling=False, x_nsf=x_nsf)

    def test_integral_float_factor_same_as_int(self) -> None:
        """``x_nsf`` is used exactly: 2 and 2.0 agree."""
        assert batch_size(1000, 7, 300, falling=False, x_nsf=2) == batch_size(
            1000, 7, 300, falling=False, x_nsf=2.0
        )

    @given(
        capacity=capacities,
        nodes=st.integers(min_value=1, max_value=500),
        used_fraction=st.floats(min_value=0, max_value=0.999),
        falling=st.booleans(),
        x_nsf=x_factors,
    )
    def test_matches_the_seed_formula(
        self, capacity: int, nodes: int, used_fraction: float, falling: bool, x_nsf: float
    ) -> None:
        """Away from exact powers of two (where float logs may round either way) the exact
        computation equals the seed's Go function, clamped to ``[1, 2^β]``."""
        used = min(int(capacity * used_fraction), capacity - 1)
        beta = math.log2(capacity / (x_nsf * nodes))
        lam = math.log2((capacity - used) / nodes)
        assume(abs(beta - round(beta)) > 1e-9 and abs(lam - round(lam)) > 1e-9)
        raw = _go_formula(capacity, x_nsf, nodes, used, 1 if falling else 0)
        ceiling = max(2.0 ** math.floor(beta), 1.0)
        assert batch_size(capacity, nodes, used, falling=falling, x_nsf=x_nsf) == min(
            max(raw, 1.0), ceiling
        )


class TestPoolSize:
    @pytest.mark.parametrize(
        ("demand", "batch", "buffer", "max_ips", "expected"),
        [
            (0, 16, 0.5, 250, 16),
            (8, 16, 0.5, 250, 16),
            (16, 16, 0.5, 250, 32),
            (32, 16, 0.5, 250, 48),
            (48, 16, 0.5, 250, 64),
            (10, 1, 0.5, 250, 11),
            (10, 16, 0.0, 250, 16),
            (500, 16, 0.5, 250, 250),
            (10, 1, 1.0, 250, 11),
        ],
    )
    def test_known_values(
        self, demand: int, batch: int, buffer: float, max_ips: int, expected: int
    ) -> None:
        """The issue's known pool sizes: ``B·⌈buffer + demand/B⌉`` clamped to ``max_ips``."""
        assert pool_size(demand, batch, buffer=buffer, max_ips=max_ips) == expected

    @pytest.mark.parametrize(
        ("demand", "batch", "buffer", "max_ips"),
        [(-1, 16, 0.5, 250), (0, 0, 0.5, 250), (0, 16, -0.1, 250), (0, 16, 0.5, 0)],
    )
    def test_bad_inputs_refused(self, demand: int, batch: int, buffer: float, max_ips: int) -> None:
        """Negative demand, a zero batch, a negative buffer or a zero maximum are refused."""
        with pytest.raises(InvalidCommand):
            pool_size(demand, batch, buffer=buffer, max_ips=max_ips)

    @given(
        demand=st.integers(min_value=0, max_value=1000),
        k=st.integers(min_value=0, max_value=12),
        buffer=buffers,
        max_ips=max_ipss,
    )
    def test_doubling_the_batch_never_shrinks_a_pool(
        self, demand: int, k: int, buffer: float, max_ips: int
    ) -> None:
        """The lemma the settled rule rests on: pools grow (weakly) with the batch."""
        small = pool_size(demand, 1 << k, buffer=buffer, max_ips=max_ips)
        assert pool_size(demand, 2 << k, buffer=buffer, max_ips=max_ips) >= small

    @given(
        demand=st.integers(min_value=0, max_value=1000),
        batch=st.integers(min_value=1, max_value=1024),
        buffer=buffers,
    )
    def test_pool_covers_demand_below_the_maximum(
        self, demand: int, batch: int, buffer: float
    ) -> None:
        """Unclamped, a pool holds every pod's IP plus at least ``buffer·B`` spare."""
        size = pool_size(demand, batch, buffer=buffer, max_ips=10**9)
        assert size % batch == 0
        assert size >= demand + Fraction(buffer) * batch


class TestExhaustion:
    def test_set_above_upper(self) -> None:
        """The flag is set when utilization rises above 90 % (and not at exactly 90 %)."""
        assert next_exhausted(False, 91, 100) is True
        assert next_exhausted(False, 90, 100) is False

    def test_cleared_below_lower(self) -> None:
        """An exhausted subnet clears below 50 % (and not at exactly 50 %)."""
        assert next_exhausted(True, 49, 100) is False
        assert next_exhausted(True, 50, 100) is True

    @pytest.mark.parametrize("used", [50, 70, 90])
    def test_between_thresholds_keeps_the_flag(self, used: int) -> None:
        """Between the thresholds the flag is whatever it was: that is the hysteresis."""
        assert next_exhausted(True, used, 100) is True
        assert next_exhausted(False, used, 100) is False

    def test_custom_thresholds(self) -> None:
        """Thresholds are configurable."""
        assert next_exhausted(False, 81, 100, upper=0.8, lower=0.2) is True
        assert next_exhausted(True, 19, 100, upper=0.8, lower=0.2) is False

    @pytest.mark.parametrize(("upper", "lower"), [(0.5, 0.9), (1.2, 0.5), (0.9, -0.1)])
    def test_bad_thresholds_refused(self, upper: float, lower: float) -> None:
        """Thresholds must be fractions with lower ≤ upper."""
        with pytest.raises(InvalidCommand):
            next_exhausted(False, 0, 100, upper=upper, lower=lower)


class TestPlanRelease:
    def test_latest_free_ips_go_first(self) -> None:
        """Surplus IPs are the most recently allocated ones not in use, listed in held order."""
        held = ("a", "b", "c", "d", "e")
        assert plan_release(held, ("e",), (), 2) == ("c", "d")

    def test_in_use_ips_never_go(self) -> None:
        """Only IPs not in use can be released, even if the surplus is larger."""
        assert plan_release(("a", "b", "c"), ("a", "c"), (), 3) == ("b",)

    def test_pending_ips_stay_pending(self) -> None:
        """A release in progress is not reshuffled when the surplus grows."""
        assert plan_release(("a", "b", "c", "d"), (), ("a",), 2) == ("a", "d")

    def test_no_surplus_releases_nothing(self) -> None:
        """A pool at or below its target releases nothing (and calls off pending releases)."""
        assert plan_release(("a", "b"), (), ("b",), 0) == ()
        assert plan_release(("a", "b"), (), (), -3) == ()


class TestSubnetBatchSize:
    def test_the_formula_cycles_on_the_issue_example(self) -> None:
        """28 nodes using 20 IPs each on a /22: the formula fed its own allocations alternates
        16 → 4 → 16 for ever (the counter-example to the seed's convergence claim)."""
        batch, seen = 16, []
        previous = None
        for _ in range(6):
            used = _allocations([20] * 28, batch, 0.5, 250)
            falling = previous is not None and used < previous
            seen.append(batch)
            batch, previous = batch_size(1024, 28, used, falling=falling), used
        assert seen == [16, 4, 16, 4, 16, 4]

    def test_the_settled_rule_on_the_issue_example(self) -> None:
        """The same subnet settles on 8: its pools (672 IPs) leave a batch per node (224)."""
        assert subnet_batch_size(1024, [20] * 28) == 8
        assert _allocations([20] * 28, 8, 0.5, 250) + 28 * 8 <= 1024
        assert _allocations([20] * 28, 16, 0.5, 250) + 28 * 16 > 1024

    @pytest.mark.parametrize(
        ("capacity", "demands", "expected"),
        [
            (1024, [], 250),
            (1024, [0] * 32, 16),
            (1024, [12] * 32, 8),
            (1024, [30] * 30, 2),
            (1024, [32] * 30, 1),
            (16, [0] * 10, 1),
            (1024, [500, 500], 250),
        ],
    )
    def test_table(self, capacity: int, demands: list[int], expected: int) -> None:
        """Worked values and edges: no nodes, an idle cluster, a busy one, an overfull one,
        β < 0, and demand beyond the per-node maximum."""
        assert subnet_batch_size(capacity, demands) == expected

    def test_non_integer_demand_refused(self) -> None:
        """Demands are counts of IPs in use."""
        with pytest.raises(InvalidCommand, match="integer"):
            subnet_batch_size(1024, [1.5])  # type: ignore[list-item]

    @settings(max_examples=300)
    @given(
        capacity=capacities,
        demands=demand_lists,
        buffer=buffers,
        x_nsf=x_factors,
        max_ips=max_ipss,
    )
    def test_largest_passing_power_of_two(
        self, capacity: int, demands: list[int], buffer: float, x_nsf: float, max_ips: int
    ) -> None:
        """The result is a power of two in ``[1, 2^β]`` clamped to ``max_ips``, passes
        ``Σ pool + N·B ≤ C`` unless it is 1, and no larger power of two up to ``2^β`` passes
        at its clamped batch."""
        b = subnet_batch_size(capacity, demands, buffer=buffer, x_nsf=x_nsf, max_ips=max_ips)
        ceiling = batch_ceiling(capacity, len(demands), x_nsf=x_nsf)
        assert 1 <= b <= min(ceiling, max_ips)
        assert b & (b - 1) == 0 or b == max_ips

        def passes(batch: int) -> bool:
            clamped = min(batch, max_ips)
            held = _allocations(demands, clamped, buffer, max_ips)
            return held + len(demands) * clamped <= capacity

        assert b == 1 or passes(b)
        larger = 2
        while larger <= ceiling:
            if min(larger, max_ips) > b:
                assert not passes(larger)
            larger *= 2

    @settings(max_examples=300)
    @given(capacity=capacities, demands=demand_lists, data=st.data())
    def test_same_demands_same_batch(
        self, capacity: int, demands: list[int], data: st.DataObject
    ) -> None:
        """The batch depends on the demands as a set of nodes only — not on their order, nor on
        anything a previous batch caused — so re-evaluating after the allocations land cannot
        move it: there is no state for a cycle to run through."""
        shuffled = data.draw(st.permutations(demands))
        assert subnet_batch_size(capacity, shuffled) == subnet_batch_size(capacity, demands)

    @settings(max_examples=300)
    @given(
        capacity=capacities,
        demands=demand_lists,
        data=st.data(),
        buffer=buffers,
        x_nsf=x_factors,
        max_ips=max_ipss,
    )
    def test_more_demand_never_a_larger_batch(
        self,
        *,
        capacity: int,
        demands: list[int],
        data: st.DataObject,
        buffer: float,
        x_nsf: float,
        max_ips: int,
    ) -> None:
        """Raising any node's demand, or adding a node, never gives a larger batch."""
        more = [
            d + data.draw(st.integers(min_value=0, max_value=300), label="increase")
            for d in demands
        ]
        more += data.draw(st.lists(st.integers(min_value=0, max_value=600), max_size=20))
        options = {"buffer": buffer, "x_nsf": x_nsf, "max_ips": max_ips}
        assert subnet_batch_size(capacity, more, **options) <= subnet_batch_size(  # type: ignore[arg-type]
            capacity,
            demands,
            **options,  # type: ignore[arg-type]
        )

    @settings(max_examples=300)
    @given(
        capacity=capacities,
        demands=demand_lists,
        buffer=buffers,
        x_nsf=x_factors,
        max_ips=max_ipss,
    )
    def test_allocations_fit_whenever_they_fit_at_one(
        self, capacity: int, demands: list[int], buffer: float, x_nsf: float, max_ips: int
    ) -> None:
        """If every node's pool at ``B = 1`` fits the subnet, so do the pools at the chosen
        batch — with a batch per node to spare when the batch is above 1."""
        b = subnet_batch_size(capacity, demands, buffer=buffer, x_nsf=x_nsf, max_ips=max_ips)
        held = _allocations(demands, b, buffer, max_ips)
        if _allocations(demands, 1, buffer, max_ips) <= capacity:
            assert held <= capacity
        if b > 1:
            assert held + len(demands) * b <= capacity


class TestClampToTheNodeMaximum:
    @pytest.mark.parametrize(
        ("capacity", "demands", "expected"),
        [
            (65536, [0], 250),
            (65536, [], 250),
            (1024, [], 250),
            (1024, [500, 500], 250),
            (1 << 20, [0] * 4, 250),
        ],
    )
    def test_batch_never_above_the_maximum(
        self, capacity: int, demands: list[int], expected: int
    ) -> None:
        """The batch is clamped to ``[1, max]``, max = min(node max IPs, 250), as the original
        clamps its scaler: a /16 with one node gets 250, never 2^15."""
        assert subnet_batch_size(capacity, demands) == expected

    def test_clamped_to_the_largest_node_maximum(self) -> None:
        """With per-node maxima the subnet's batch is clamped to the largest of them."""
        assert subnet_batch_size(65536, [0, 0], node_max_ips=[30, 110]) == 110
        assert subnet_batch_size(65536, [0, 0], node_max_ips=[30, 30]) == 30

    def test_node_maxima_must_match_the_demands(self) -> None:
        """One maximum per node, or none at all."""
        with pytest.raises(InvalidCommand, match="one per node"):
            subnet_batch_size(1024, [0, 0], node_max_ips=[30])

    @pytest.mark.parametrize("max_ips", [0, 251, 1000])
    def test_maximum_out_of_range_refused(self, max_ips: int) -> None:
        """A node can run at most 250 pods, so it never needs more IPs than that."""
        with pytest.raises(InvalidCommand, match="between 1 and 250"):
            subnet_batch_size(1024, [0], max_ips=max_ips)

    def test_subnet_safety_factor(self) -> None:
        """``x_ssf`` scales the subnet handed out: ``β = ⌊log2(X_ssf·C / (X_nsf·N))⌋``."""
        assert batch_ceiling(1024, 32, x_ssf=0.5) == 8
        assert subnet_batch_size(1024, [0] * 32, x_ssf=0.5) == 8
        assert subnet_batch_size(1024, [0] * 32, x_ssf=1.0) == 16

    @pytest.mark.parametrize("x_ssf", [0.0, -0.5, 1.01, math.nan, math.inf, True])
    def test_bad_subnet_safety_factor_refused(self, x_ssf: float) -> None:
        """The subnet safety factor is a fraction of the subnet in ``(0, 1]``."""
        with pytest.raises(InvalidCommand, match=r"x_ssf.*\(0, 1\]"):
            subnet_batch_size(1024, [0], x_ssf=x_ssf)

    @settings(max_examples=300)
    @given(
        capacity=capacities,
        demands=demand_lists,
        buffer=buffers,
        x_nsf=x_factors,
        data=st.data(),
    )
    def test_per_node_maxima_keep_the_rule(
        self,
        *,
        capacity: int,
        demands: list[int],
        buffer: float,
        x_nsf: float,
        data: st.DataObject,
    ) -> None:
        """With per-node maxima the batch is in ``[1, largest maximum]``, and when above 1 the
        pools at each node's own batch ``min(B, m_i)`` leave that batch per node free."""
        count = len(demands)
        maxima = data.draw(st.lists(st.integers(1, 250), min_size=count, max_size=count))
        b = subnet_batch_size(capacity, demands, buffer=buffer, x_nsf=x_nsf, node_max_ips=maxima)
        assert 1 <= b <= max(maxima, default=250)
        if b > 1:
            held = sum(
                pool_size(d, min(b, m), buffer=buffer, max_ips=m)
                for d, m in zip(demands, maxima, strict=True)
            )
            assert held + sum(min(b, m) for m in maxima) <= capacity


class TestSubnetFloor:
    def test_floor_is_every_pool_at_one(self) -> None:
        """The floor counts each node's pods plus one spare, clamped per node."""
        assert subnet_floor([0, 10, 300]) == 1 + 11 + 250
        assert subnet_floor([]) == 0
