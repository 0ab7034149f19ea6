"""Cloud errors: one tree for every ``CloudMachines`` adapter, translated at the adapter edge.

Exception tree::

    CloudError                 code, message, retryable, retry_after, provider_code
     ├── QuotaExceeded         "quota_exceeded"        the subscription's quota would be exceeded
     ├── CapacityUnavailable   "capacity_unavailable"  no capacity for the size in ``zone``
     ├── SkuUnavailable        "sku_unavailable"       the size is not offered here (region/zone)
     ├── Throttled             "throttled"             too many requests; wait ``retry_after`` s
     ├── OperationRefused      "not_allowed"           ARM refused the operation (not for quota)
     ├── NameInUse             "name_in_use"           the machine name belongs to another owner
     └── UnknownCloudError     "unknown"               anything else; ``retryable`` as classified

    CloudSetupError            the adapter cannot work with what it was pointed at (start-up)

``code`` is the stable string callers record in the log and branch on; ``provider_code`` keeps the
cloud's own code (e.g. ``ZonalAllocationFailed``) for people reading that log. ``retryable`` says
whether sending the *same* request again later may succeed: quota, SKU and zonal capacity refusals
need a different request (another size or zone), so they are not retryable.

:func:`classify_arm_error` maps Azure Resource Manager error codes to the tree;
:func:`from_azure_error` translates azure-core exceptions, so adapters can write
``raise from_azure_error(e) from e``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import ClassVar

from azure.core.exceptions import AzureError, HttpResponseError, ServiceRequestError

__all__ = [
    "CapacityUnavailable",
    "CloudError",
    "CloudSetupError",
    "NameInUse",
    "OperationRefused",
    "QuotaExceeded",
    "SkuUnavailable",
    "Throttled",
    "UnknownCloudError",
    "classify_arm_error",
    "from_azure_error",
    "retry_after_seconds",
]


class CloudError(Exception):
    """Base of every error a cloud adapter raises or reports for a machine."""

    code: ClassVar[str] = "unknown"
    #: Class default; :class:`UnknownCloudError` sets it per instance.
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        provider_code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.provider_code = provider_code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, provider_code={self.provider_code!r})"


class QuotaExceeded(CloudError):
    """Creating the machine would exceed a subscription quota (cores, VMs, public IPs…)."""

    code = "quota_exceeded"


class CapacityUnavailable(CloudError):
    """The region or ``zone`` has no capacity for the size right now; try another zone or size."""

    code = "capacity_unavailable"

    def __init__(
        self,
        message: str,
        *,
        zone: str | None = None,
        provider_code: str | None = None,
    ) -> None:
        super().__init__(message, provider_code=provider_code)
        self.zone = zone


class SkuUnavailable(CloudError):
    """The VM size is not offered (or restricted) for this subscription in the region or zone."""

    code = "sku_unavailable"


class Throttled(CloudError):
    """The provider refused the request for its rate; wait ``retry_after`` seconds if given."""

    code = "throttled"
    retryable = True

    def __init__(
        self,
        message: str = "too many requests",
        *,
        retry_after: float | None = None,
        provider_code: str | None = None,
    ) -> None:
        super().__init__(message, retry_after=retry_after, provider_code=provider_code)


class OperationRefused(CloudError):
    """ARM refused the operation for a reason of its own (``OperationNotAllowed`` not about quota).

    Not retryable: the same request meets the same policy.
    """

    code = "not_allowed"


class NameInUse(CloudError):
    """A machine of that name exists and its ownership tags say it is not ours; never taken over."""

    code = "name_in_use"


class CloudSetupError(Exception):
    """The adapter cannot work against what it was configured for (raised at start-up).

    Not a :class:`CloudError`: no machine's outcome is involved; the message says what to fix.
    """


class UnknownCloudError(CloudError):
    """Any other failure; ``retryable`` is true for server-side and transport failures."""

    code = "unknown"

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        provider_code: str | None = None,
    ) -> None:
        super().__init__(message, provider_code=provider_code)
        self.retryable = retryable


# Azure error codes, from "Troubleshoot common Azure deployment errors"
# (https://learn.microsoft.com/azure/azure-resource-manager/troubleshooting/common-deployment-errors)
# and the compute allocation-failure guide
# (https://learn.microsoft.com/troubleshoot/azure/virtual-machines/allocation-failure).
_QUOTA_CODES = frozenset({"QuotaExceeded"})
# Compute answers a core-quota overrun with 409 OperationNotAllowed ("…results in exceeding
# approved standardDSv3Family Cores quota…"), but the same code refuses much else (an operation
# on a deallocating VM, a change to an immutable property): only a cores quota named in the
# message makes it quota.
_NOT_ALLOWED_CODE = "OperationNotAllowed"
_CORES_QUOTA_PHRASES = ("family cores quota", "total regional cores quota", "lowprioritycores")
_CAPACITY_CODES = frozenset(
    {
        "ZonalAllocationFailed",  # no capacity for the size in the requested zone
        "AllocationFailed",  # no capacity in the region / cluster
        "OverconstrainedZonalAllocationRequest",  # zone plus other constraints cannot be met
        "OverconstrainedAllocationRequest",  # same, without a zone
    }
)
_SKU_CODES = frozenset({"SkuNotAvailable", "VMSizeNotSupported"})
# AKS answers a size the subscription may not use with a generic BadRequest; its message is
# "… VM size of Standard_X is not supported for subscription … in location …".
_SKU_BAD_REQUEST_PHRASE = "is not supported for subscription"
_THROTTLE_CODES = frozenset({"TooManyRequests"})  # ARM's body code that comes with HTTP 429


def classify_arm_error(
    code: str | None,
    message: str = "",
    *,
    status: int | None = None,
    retry_after: float | None = None,
    zone: str | None = None,
) -> CloudError:
    """The :class:`CloudError` for an ARM error ``code`` (and HTTP ``status``, if any).

    ``zone`` is the zone the failed request asked for; ARM's message names it only in prose, so
    the adapter passes what it requested.
    """
    text = message or code or f"HTTP {status}"
    if status == 429 or code in _THROTTLE_CODES:
        return Throttled(text, retry_after=retry_after, provider_code=code)
    if code in _QUOTA_CODES:
        return QuotaExceeded(text, provider_code=code)
    if code == _NOT_ALLOWED_CODE:
        lowered = message.lower()
        if any(phrase in lowered for phrase in _CORES_QUOTA_PHRASES):
            return QuotaExceeded(text, provider_code=code)
        return OperationRefused(text, provider_code=code)
    if code in _CAPACITY_CODES:
        return CapacityUnavailable(text, zone=zone, provider_code=code)
    if code in _SKU_CODES or (code == "BadRequest" and _SKU_BAD_REQUEST_PHRASE in message):
        return SkuUnavailable(text, provider_code=code)
    # 5xx and 408 are the provider's own trouble: the same request may well succeed later.
    retryable = status is not None and (status >= 500 or status == 408)
    return UnknownCloudError(text, retryable=retryable, provider_code=code)


def from_azure_error(error: AzureError, *, zone: str | None = None) -> CloudError:
    """Translate an azure-core exception; use as ``raise from_azure_error(e) from e``.

    A ``ServiceResponseError`` (request sent, answer lost) means the outcome is unknown; adapters
    must treat the machine as unknown rather than call this.
    """
    if isinstance(error, HttpResponseError):
        odata = error.error
        code = odata.code if odata is not None else None
        message = (odata.message if odata is not None else None) or str(error.message)
        # azure-core types the response loosely; every transport's response has headers.
        headers: Mapping[str, str] = getattr(error.response, "headers", None) or {}
        return classify_arm_error(
            code,
            message,
            status=error.status_code,
            retry_after=retry_after_seconds(headers),
            zone=zone,
        )
    if isinstance(error, ServiceRequestError):
        return UnknownCloudError(f"request could not be sent: {error.message}", retryable=True)
    return UnknownCloudError(f"{type(error).__name__}: {error.message}", retryable=True)


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms``, ``x-ms-retry-after-ms`` or ``Retry-After``.

    ``Retry-After`` may be delta-seconds or an HTTP-date (RFC 9110 §10.2.3); ARM sends seconds.
    Unparseable values are ignored rather than trusted.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    for name in ("retry-after-ms", "x-ms-retry-after-ms"):
        if name in lowered:
            try:
                return max(0.0, float(lowered[name]) / 1000)
            except ValueError:
                pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
