"""Errors of the pod-IP runtime: one tree, raised at this package's boundary.

Exception tree::

    IpamError                         base of everything ``adapters.ipam`` raises
     ├── InvalidIpamCommand (ValueError) a command is malformed (a negative demand, an empty
     │                                node name); nothing was appended
     ├── CommandRejected              the subnet refused a well-formed command (a node not
     │                                joined, IPs held by another node); ``reason`` says what to
     │                                do. Nothing was appended
     ├── UnknownSubnet (KeyError)     no subnet with that id was ever created
     ├── LogUnavailable               the event log stayed unreachable through every retry; the
     │                                command may or may not have landed — send it again (the
     │                                commands are idempotent)
     ├── LogContention                the subnet stream kept moving under this process
     ├── NotLeader                    a leader duty (recording an allocator answer) was fenced: a
     │                                newer leader term runs the allocator now
     └── AllocatorUnavailable         the IP allocator could not be reached; the call is made
                                      again when the subnet next changes or the leader restarts

Errors from the layers below (``adapters.runtime``, ``domain``) are translated here with
``raise … from e``; callers of this package handle this tree only.
"""

from __future__ import annotations

__all__ = [
    "AllocatorUnavailable",
    "CommandRejected",
    "InvalidIpamCommand",
    "IpamError",
    "LogContention",
    "LogUnavailable",
    "NotLeader",
    "UnknownSubnet",
]


class IpamError(Exception):
    """Base class of every error the pod-IP runtime raises."""


class InvalidIpamCommand(IpamError, ValueError):
    """Raised when a command is malformed; nothing was appended."""


class CommandRejected(IpamError):
    """Raised when the subnet refuses a command for ``reason``; nothing was appended."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnknownSubnet(IpamError, KeyError):
    """Raised when addressing a subnet that was never created."""

    def __init__(self, subnet_id: str) -> None:
        super().__init__(subnet_id)
        self.subnet_id = subnet_id

    def __str__(self) -> str:
        return f"no subnet {self.subnet_id!r} was created; create it first (CreateSubnet)"


class LogUnavailable(IpamError):
    """Raised when the event log stayed unreachable through every retry."""


class LogContention(IpamError):
    """Raised when expected-version conflicts on a subnet stream did not settle."""


class NotLeader(IpamError):
    """Raised when a leader duty's append was fenced by a newer leader term."""


class AllocatorUnavailable(IpamError):
    """Raised by an :class:`~fleetledger.adapters.ipam.allocator.IpAllocator` that cannot be
    reached or refused the call; the runtime tries again later."""
