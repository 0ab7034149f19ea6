"""A runtime's side of leadership: whether it leads now, and its duties turned on and off.

Every capability's runtime has duties only the leader may perform (reactors, clock drivers, calls
to the cloud or the cluster). :class:`Duties` holds that switch once for all of them: without a
:class:`~fleetledger.adapters.runtime.leadership.Leadership` the runtime leads from start to stop
(one process); with one, it leads while this process is elected — ``on_lead(term)`` when elected
(at once if the process already leads), ``on_follow(reason)`` the moment it is deposed.

The process owns its one Leadership and shares it among its runtimes; a runtime built with
``manage_leadership=True`` (the default, for a runtime on its own) also starts and stops it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .leadership import Leadership, Role

__all__ = ["Duties"]


class Duties:
    """The leading switch of one runtime; thread-safe."""

    def __init__(
        self,
        leadership: Leadership | None,
        *,
        on_lead: Callable[[int | None], None],
        on_follow: Callable[[str], None],
        manage_leadership: bool = True,
    ) -> None:
        self.leadership = leadership
        self._on_lead = on_lead
        self._on_follow = on_follow
        self._manage = manage_leadership
        self._leading = threading.Event()
        self._active = False
        if leadership is not None:
            leadership.on_elected(self._elected)
            leadership.on_deposed(self._deposed)

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    @property
    def role(self) -> Role:
        """``leader`` or ``follower`` (without leadership a started runtime leads)."""
        return "leader" if self.leading else "follower"

    @property
    def term(self) -> int | None:
        """The term this process leads in, if it was elected."""
        return None if self.leadership is None else self.leadership.term()

    def start(self, *, threads: bool) -> None:
        """Lead now (no leadership), at once if the process already leads, or once elected."""
        self._active = True
        if self.leadership is None:
            self._elected(None)
            return
        term = self.leadership.term()
        if term is not None:
            self._elected(term)
        elif self._manage:
            if threads:
                self.leadership.start()
            else:
                self.leadership.step()

    def relinquish(self) -> None:
        """Stop leading for good (a stop): no more duties, whatever the leadership does."""
        self._active = False
        self._leading.clear()

    def release(self, timeout: float | None = 10.0) -> None:
        """Release the process's leadership, when this runtime manages it."""
        if self.leadership is not None and self._manage:
            self.leadership.stop(timeout)

    def _elected(self, term: int | None) -> None:
        if not self._active:
            return
        self._leading.set()
        self._on_lead(term)

    def _deposed(self, reason: str) -> None:
        self._leading.clear()
        self._on_follow(reason)
