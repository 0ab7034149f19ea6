"""The cloud error tree and its translation from ARM codes and azure-core exceptions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from azure.core.exceptions import ServiceRequestError

from fleetledger.adapters.cloud import (
    CapacityUnavailable,
    CloudError,
    NameInUse,
    OperationRefused,
    QuotaExceeded,
    SkuUnavailable,
    Throttled,
    UnknownCloudError,
    classify_arm_error,
    from_azure_error,
)
from fleetledger.adapters.cloud.errors import retry_after_seconds
from fleetledger.domain.machines import ERROR_CODES


class TestTree:
    def test_every_error_has_its_own_stable_code(self) -> None:
        """Codes are what the log records, so each class has one and they never collide."""
        classes: list[type[CloudError]] = [
            QuotaExceeded,
            CapacityUnavailable,
            SkuUnavailable,
            Throttled,
            OperationRefused,
            NameInUse,
            UnknownCloudError,
        ]

        assert all(issubclass(c, CloudError) for c in classes)
        assert [c.code for c in classes] == [
            "quota_exceeded",
            "capacity_unavailable",
            "sku_unavailable",
            "throttled",
            "not_allowed",
            "name_in_use",
            "unknown",
        ]

    def test_every_code_is_one_the_domain_records(self) -> None:
        """The coordinator records ``code`` as a domain ErrorCode; an unknown one would be lost."""
        classes: list[type[CloudError]] = [
            QuotaExceeded,
            CapacityUnavailable,
            SkuUnavailable,
            Throttled,
            OperationRefused,
            NameInUse,
            UnknownCloudError,
        ]

        assert {c.code for c in classes} <= set(ERROR_CODES)


class TestClassifyArmError:
    @pytest.mark.parametrize(
        ("code", "expected"),
        [
            ("QuotaExceeded", QuotaExceeded),
            ("OperationNotAllowed", OperationRefused),
            ("ZonalAllocationFailed", CapacityUnavailable),
            ("AllocationFailed", CapacityUnavailable),
            ("OverconstrainedZonalAllocationRequest", CapacityUnavailable),
            ("SkuNotAvailable", SkuUnavailable),
            ("VMSizeNotSupported", SkuUnavailable),
            ("TooManyRequests", Throttled),
            ("InvalidParameter", UnknownCloudError),
            (None, UnknownCloudError),
        ],
    )
    def test_maps_arm_codes_to_the_tree(self, code: str | None, expected: type[CloudError]) -> None:
        """Each documented Azure error code lands on its class and keeps the provider code."""
        error = classify_arm_error(code, "message")

        assert type(error) is expected
        assert error.provider_code == code

    @pytest.mark.parametrize(
        "message",
        [
            "Operation could not be completed as it results in exceeding approved "
            "standardDSv3Family Cores quota. Additional details …",
            "… exceeding approved Total Regional Cores quota …",
            "… exceeding approved LowPriorityCores quota …",
        ],
    )
    def test_operation_not_allowed_naming_a_cores_quota_is_quota(self, message: str) -> None:
        """OperationNotAllowed is quota only when its message names a cores quota."""
        error = classify_arm_error("OperationNotAllowed", message, status=409)

        assert isinstance(error, QuotaExceeded)

    def test_operation_not_allowed_for_anything_else_is_a_refusal(self) -> None:
        """Any other OperationNotAllowed is a refusal of its own kind, not retryable."""
        error = classify_arm_error(
            "OperationNotAllowed", "Changing property 'vmSize' is not allowed.", status=409
        )

        assert isinstance(error, OperationRefused)
        assert (error.code, error.retryable) == ("not_allowed", False)

    def test_bad_request_for_a_size_not_supported_is_sku_unavailable(self) -> None:
        """AKS's BadRequest "… is not supported for subscription …" means the size is not ours
        to use; other BadRequests stay unknown."""
        sku = classify_arm_error(
            "BadRequest",
            "The VM size of Standard_NC6 is not supported for subscription s in location x.",
        )
        other = classify_arm_error("BadRequest", "The request body is malformed.")

        assert isinstance(sku, SkuUnavailable)
        assert isinstance(other, UnknownCloudError)

    def test_http_429_is_throttled_whatever_the_code(self) -> None:
        """The status alone is enough to know the request was throttled."""
        error = classify_arm_error(None, status=429, retry_after=12.0)

        assert isinstance(error, Throttled)
        assert error.retry_after == 12.0

    def test_capacity_errors_carry_the_requested_zone(self) -> None:
        """The zone comes from the request, since ARM only names it in prose."""
        error = classify_arm_error("ZonalAllocationFailed", zone="3")

        assert isinstance(error, CapacityUnavailable)
        assert error.zone == "3"

    @pytest.mark.parametrize(("status", "retryable"), [(500, True), (503, True), (400, False)])
    def test_unknown_errors_are_retryable_only_when_server_side(
        self, status: int, retryable: bool
    ) -> None:
        """5xx may succeed later; a 4xx the tree does not know will fail the same way again."""
        assert classify_arm_error("Whatever", status=status).retryable is retryable


class TestFromAzureError:
    def test_a_request_that_was_never_sent_is_unknown_and_retryable(self) -> None:
        """A connection failure before sending created nothing; sending again is safe."""
        error = from_azure_error(ServiceRequestError("connection refused"))

        assert isinstance(error, UnknownCloudError)
        assert error.retryable


class TestRetryAfterSeconds:
    @pytest.mark.parametrize(
        ("headers", "seconds"),
        [
            ({"Retry-After": "7"}, 7.0),
            ({"retry-after-ms": "1500", "Retry-After": "7"}, 1.5),
            ({"x-ms-retry-after-ms": "250"}, 0.25),
            ({"Retry-After": "soon"}, None),
            ({}, None),
        ],
    )
    def test_reads_seconds_and_milliseconds(
        self, headers: dict[str, str], seconds: float | None
    ) -> None:
        """Millisecond headers win; unparseable values are ignored, not trusted."""
        assert retry_after_seconds(headers) == seconds

    def test_reads_an_http_date(self) -> None:
        """Retry-After may be a date; it becomes the seconds until then."""
        later = datetime.now(UTC) + timedelta(seconds=120)

        seconds = retry_after_seconds({"Retry-After": format_datetime(later, usegmt=True)})

        assert seconds is not None
        assert 100 < seconds <= 120
