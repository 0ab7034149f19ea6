"""The in-memory allocator fake keeps the port's promises: idempotent calls, partial answers."""

from __future__ import annotations

import pytest

from fleetledger.adapters.ipam import AllocatorUnavailable, InMemoryAllocator

from .support import SUBNET, allocator


class TestAllocate:
    def test_the_same_request_gets_the_same_answer(self) -> None:
        """Asking again for a request already answered hands out nothing new."""
        fake = allocator()

        first = fake.allocate(SUBNET, "n", request=1, count=4)
        again = fake.allocate(SUBNET, "n", request=1, count=4)

        assert first == again and len(first) == 4
        assert fake.held(SUBNET) == {"n": first}

    def test_a_short_subnet_answers_what_it_has(self) -> None:
        """Fewer IPs than asked when the subnet runs out; none once it is full."""
        fake = allocator(capacity=6)

        assert len(fake.allocate(SUBNET, "a", request=1, count=4)) == 4
        assert len(fake.allocate(SUBNET, "b", request=1, count=4)) == 2
        assert fake.allocate(SUBNET, "c", request=1, count=4) == ()

    def test_an_unknown_subnet_is_unavailable(self) -> None:
        """The port's own error, naming what to do."""
        with pytest.raises(AllocatorUnavailable, match="add_subnet"):
            InMemoryAllocator().allocate("nowhere", "n", request=1, count=1)


class TestRelease:
    def test_released_ips_are_handed_out_again(self) -> None:
        """A release frees the node's IPs for the next request."""
        fake = allocator(capacity=2)
        ips = fake.allocate(SUBNET, "a", request=1, count=2)

        fake.release(SUBNET, "a", ips)

        assert fake.allocate(SUBNET, "b", request=1, count=2) == ips

    def test_ips_of_another_node_are_not_released(self) -> None:
        """Releasing is idempotent and never frees what another node holds."""
        fake = allocator()
        ips = fake.allocate(SUBNET, "a", request=1, count=2)

        fake.release(SUBNET, "b", ips)
        fake.release(SUBNET, "a", ips[:1])
        fake.release(SUBNET, "a", ips[:1])

        assert fake.held(SUBNET) == {"a": ips[1:]}

    def test_the_lowest_free_ips_go_first_and_each_to_one_node(self) -> None:
        """Freed IPs below the untouched ones are handed out first, in address order, and an IP
        released twice is still handed to one node only."""
        fake = allocator(capacity=6)  # 10.0.0.0 to 10.0.0.5
        low = fake.allocate(SUBNET, "a", request=1, count=2)
        middle = fake.allocate(SUBNET, "b", request=1, count=2)
        fake.release(SUBNET, "b", middle)
        fake.release(SUBNET, "a", low[1:])
        fake.release(SUBNET, "a", low[1:])

        again = fake.allocate(SUBNET, "c", request=1, count=6)

        assert (low, middle) == (("10.0.0.0", "10.0.0.1"), ("10.0.0.2", "10.0.0.3"))
        assert again == ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5")
        assert fake.held(SUBNET) == {"a": ("10.0.0.0",), "c": again}
