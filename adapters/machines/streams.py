"""Stream names of the machine-request runtime: one grouper stream, one stream per batch.

``vmgrouper-<grouper>`` holds every grouper decision; ``vmbatch-<grouper>-<batch_id>`` the life of
one sealed batch. The grouper's name is in the batch stream's id because batch ids
(``<template hash>-<sequence>``) count batches *per grouper stream*: two groupers in one database
(e.g. simulator runs on a shared Postgres) would otherwise open the same batch stream. The
category (the part before the first ``-``) is ``vmgrouper`` or ``vmbatch``.
"""

from __future__ import annotations

import re

__all__ = [
    "DEFAULT_GROUPER",
    "batch_stream_id",
    "batch_stream_prefix",
    "grouper_stream_id",
    "validate_grouper_name",
]

DEFAULT_GROUPER = "default"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def validate_grouper_name(name: str) -> str:
    """Return ``name`` if it can name a grouper; ``ValueError`` saying what is allowed if not."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"grouper name {name!r} must be 1-63 characters of a-z, 0-9, '-' or '_', starting "
            "with a letter or digit, e.g. 'default' or 'eastus-pool1'"
        )
    return name


def grouper_stream_id(grouper: str) -> str:
    """The grouper's stream."""
    return f"vmgrouper-{validate_grouper_name(grouper)}"


def batch_stream_prefix(grouper: str) -> str:
    """What every batch stream of ``grouper`` starts with (the batch id follows)."""
    return f"vmbatch-{validate_grouper_name(grouper)}-"


def batch_stream_id(grouper: str, batch_id: str) -> str:
    """The stream of batch ``batch_id`` sealed by ``grouper``."""
    return batch_stream_prefix(grouper) + batch_id
