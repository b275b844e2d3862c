"""The fake NVML's `nvmlDeviceGetFieldValues`: which fields it answers and how one answer per field is written.

nvml.h: one call, one answer per field; a field the device cannot give carries its own error code in `nvmlReturn`
while the others answer, and only a whole-device fault (uninitialised, a bad handle, a lost GPU) fails the call.
A field's value is what its single-value function answers, and a fault injected on that function is the field's
error (gpufarm_node.fake_nvml).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import pynvml

# The fields the fake answers: the function whose value (and injected faults) each field shares, and its value
# type. Remapped rows: correctable, uncorrectable, pending, failure, in nvmlDeviceGetRemappedRows' order.
FIELD_SOURCES: Final[dict[int, tuple[str, int]]] = {
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (
        "nvmlDeviceGetTotalEnergyConsumption",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
    ),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: ("nvmlDeviceGetTotalEccErrors", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG),
    **dict.fromkeys(
        (
            pynvml.NVML_FI_DEV_REMAPPED_COR,
            pynvml.NVML_FI_DEV_REMAPPED_UNC,
            pynvml.NVML_FI_DEV_REMAPPED_PENDING,
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
        ),
        ("nvmlDeviceGetRemappedRows", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT),
    ),
}


def field_values(field_ids: Sequence[Any], answer: Callable[[int, str], int], stamp_us: int) -> Any:
    """pynvml's array of `c_nvmlFieldValue_t`, one per requested field (an id, or an (id, scope) pair as pynvml
    takes them): `answer(field_id, function)` gives a known field's value or raises that function's NVML error."""
    values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
    for value, requested in zip(values, field_ids, strict=True):
        field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
        value.fieldId, value.scopeId, value.timestamp, value.latencyUsec = field_id, scope, stamp_us, 0
        source = FIELD_SOURCES.get(field_id)
        if source is None:
            value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            continue
        function, value_type = source
        try:
            number = answer(field_id, function)
        except pynvml.NVMLError as exc:
            value.nvmlReturn = exc.value
            continue
        value.nvmlReturn = pynvml.NVML_SUCCESS
        value.valueType = value_type
        if value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
            value.value.ullVal = number
        else:
            value.value.uiVal = number
    return values
