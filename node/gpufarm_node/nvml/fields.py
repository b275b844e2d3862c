"""pynvml's ctypes structures read through their field descriptors, and the sample windows built on them.

pynvml's structures override `__getattribute__` in Python (a bytes -> str conversion numeric fields never need):
reading a field that way costs more than the NVML call per sample, and a cycle reads hundreds of samples (about 90
per GPU in a 15 s window) besides every device's memory and every slice's GPM metrics.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

import pynvml

# The field of pynvml's value union each sample type fills.
VALUE_FIELDS: Final = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

# Utilization samples and per-process samples.
_SAMPLE: Final = pynvml.c_nvmlSample_t
_SAMPLE_TIME: Final = _SAMPLE.__dict__["timeStamp"].__get__
_SAMPLE_VALUE: Final = _SAMPLE.__dict__["sampleValue"].__get__
_EXACT_SUM_FIELDS: Final = frozenset(("uiVal", "siVal", "usVal"))
_VALUE_READERS: Final = {name: pynvml.c_nvmlValue_t.__dict__[name].__get__ for name in VALUE_FIELDS.values()}
_PROC_SAMPLE: Final = pynvml.c_nvmlProcessUtilizationSample_t
_PROC_PID: Final = _PROC_SAMPLE.__dict__["pid"].__get__
_PROC_TIME: Final = _PROC_SAMPLE.__dict__["timeStamp"].__get__
_PROC_SM: Final = _PROC_SAMPLE.__dict__["smUtil"].__get__
# The structures read every cycle on every device or slice: memory (v2) and the GPM metrics' request and answers.
# Numeric fields only, so the bytes -> str conversion pynvml's overrides exist for never applies.
MEMORY_V2: Final = pynvml.c_nvmlMemory_v2_t
MEMORY_V2_READ: Final = tuple(MEMORY_V2.__dict__[name].__get__ for name in ("total", "used", "free", "reserved"))
_GPM_GET: Final = pynvml.c_nvmlGpmMetricsGet_t
GPM_SET_SAMPLE1: Final = _GPM_GET.__dict__["sample1"].__set__
GPM_SET_SAMPLE2: Final = _GPM_GET.__dict__["sample2"].__set__
GPM_ENTRIES: Final = _GPM_GET.__dict__["metrics"].__get__
GPM_RETURN: Final = pynvml.c_nvmlGpmMetric_t.__dict__["nvmlReturn"].__get__
GPM_VALUE: Final = pynvml.c_nvmlGpmMetric_t.__dict__["value"].__get__


def fresh_samples(samples: list[Any], since: int, attr: str) -> tuple[int, float, int] | None:
    """(newest timestamp, sum, count) of the samples taken after `since`; None when there is none."""
    if samples and type(samples[0]) is _SAMPLE:
        stamps = list(map(_SAMPLE_TIME, samples))
        values = list(map(_VALUE_READERS.get(attr, _VALUE_READERS["uiVal"]), map(_SAMPLE_VALUE, samples)))
    else:  # anything else shaped like pynvml's samples
        stamps = [s.timeStamp for s in samples]
        values = [getattr(s.sampleValue, attr) for s in samples]
    if stamps and attr in _EXACT_SUM_FIELDS and min(stamps) > since:
        # Every sample is new (NVML answers only newer ones), and sums of a window of 32-bit integers stay far
        # below 2**53, where integers are exact floats: the same total as adding them one by one as floats.
        return max(stamps), float(sum(values)), len(values)
    fresh = [float(v) for t, v in zip(stamps, values, strict=True) if t > since]
    if not fresh:
        return None
    return max(stamps), sum(fresh), len(fresh)


def process_means(samples: list[Any], since: int) -> tuple[int, dict[int, float]]:
    """(newest timestamp, mean SM % by pid) of the per-process samples taken after `since`."""
    if samples and type(samples[0]) is _PROC_SAMPLE:
        stamps = list(map(_PROC_TIME, samples))
        pids = list(map(_PROC_PID, samples))
        sms = list(map(_PROC_SM, samples))
    else:
        stamps = [s.timeStamp for s in samples]
        pids = [s.pid for s in samples]
        sms = [s.smUtil for s in samples]
    if not stamps:
        return since, {}
    if min(stamps) <= since:
        # NVML answers only samples newer than the timestamp asked for; keep the rule for any that are not.
        fresh = [(t, pid, sm) for t, pid, sm in zip(stamps, pids, sms, strict=True) if t > since]
        if not fresh:
            return since, {}
        stamps, pids, sms = (list(column) for column in zip(*fresh, strict=True))
    if len(set(pids)) == len(pids):
        # The usual answer, one sample per process (nvml.h: NVML aggregates each process's samples since the
        # timestamp): each mean is its one value, as a float (0.0 + value, / 1), built in C.
        return max(stamps), dict(zip(pids, map(float, sms), strict=True))
    # Sums in the samples' order (0.0 + the first is the first as a float), counts by C's Counter.
    sums: dict[int, float] = {}
    get = sums.get
    for pid, sm in zip(pids, sms, strict=True):
        sums[pid] = get(pid, 0.0) + sm
    counts = Counter(pids)
    return max(stamps), {pid: total / counts[pid] for pid, total in sums.items()}


# The per-GPU counters read with one nvmlDeviceGetFieldValues (as Datadog's Go check reads its fields): the energy
# counter (mJ, nvmlDeviceGetTotalEnergyConsumption's), uncorrected volatile ECC errors (nvml.h: uncorrected ECC
# errors are the double-bit ones, nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)'s) and the remapped rows
# (nvmlDeviceGetRemappedRows' four values, in its order).
COUNTER_FIELDS: Final = (
    pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    pynvml.NVML_FI_DEV_REMAPPED_COR,
    pynvml.NVML_FI_DEV_REMAPPED_UNC,
    pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
)
_FIELD_VALUE: Final = pynvml.c_nvmlFieldValue_t
_FIELD_RETURN: Final = _FIELD_VALUE.__dict__["nvmlReturn"].__get__
_FIELD_TYPE: Final = _FIELD_VALUE.__dict__["valueType"].__get__
_FIELD_UNION: Final = _FIELD_VALUE.__dict__["value"].__get__
_FIELD_READERS: Final = {kind: _VALUE_READERS[name] for kind, name in VALUE_FIELDS.items()}


def field_numbers(values: Any) -> list[int | None]:
    """Each answered field's value as an integer, in order; None for a field that did not answer (its own error
    code in `nvmlReturn`) or answered in a type that is not a number."""
    out: list[int | None] = []
    append = out.append
    for value in values:
        reader = _FIELD_READERS.get(_FIELD_TYPE(value)) if _FIELD_RETURN(value) == pynvml.NVML_SUCCESS else None
        append(None if reader is None else int(reader(_FIELD_UNION(value))))
    return out
