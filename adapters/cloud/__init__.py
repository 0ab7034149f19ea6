"""The cloud port (``CloudMachines``), its error tree, and the in-memory fake.

The real adapters live in their own modules and are imported from there, so that using the port
or the fake never needs their SDKs: ``adapters.cloud.aks.AksMachinesCloud`` (needs the optional
``azure-mgmt-containerservice``) and ``adapters.cloud.azure_vm.AzureVmCloud``; their credential
and clients come from ``adapters.cloud.azure_session.AzureSession``. Tests against the real SDKs
use ``tests.adapters.cloud.fake_arm.FakeArmServer`` (in the repository's tests).
"""

from __future__ import annotations

from .errors import (
    CapacityUnavailable,
    CloudError,
    CloudSetupError,
    NameInUse,
    OperationRefused,
    QuotaExceeded,
    SkuUnavailable,
    Throttled,
    UnknownCloudError,
    classify_arm_error,
    from_azure_error,
)
from .fake import FakeCall, FakeCloud
from .port import (
    BATCH_PUT_MACHINE_HEADER,
    BatchCreate,
    BatchCreateResult,
    CloudMachines,
    MachineObservation,
    MachineSpec,
    MachineStatus,
    ProgressCallback,
    ProgressNote,
    batch_put_machine_header,
    encode_batch_put_machine_header,
)

__all__ = [
    "BATCH_PUT_MACHINE_HEADER",
    "BatchCreate",
    "BatchCreateResult",
    "CapacityUnavailable",
    "CloudError",
    "CloudMachines",
    "CloudSetupError",
    "FakeCall",
    "FakeCloud",
    "MachineObservation",
    "MachineSpec",
    "MachineStatus",
    "NameInUse",
    "OperationRefused",
    "ProgressCallback",
    "ProgressNote",
    "QuotaExceeded",
    "SkuUnavailable",
    "Throttled",
    "UnknownCloudError",
    "batch_put_machine_header",
    "classify_arm_error",
    "encode_batch_put_machine_header",
    "from_azure_error",
]
