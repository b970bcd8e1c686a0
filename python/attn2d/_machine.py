"""The machine a benchmark ran on, named in its report: the CPU's model, family and model
numbers, the instruction sets the kernels care about and the CPUs the process may use."""

from __future__ import annotations

import os
import platform
from typing import Optional

# /proc/cpuinfo flag -> the name a report gives it, in the report's order.
_FEATURES = (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("avx512_fp16", "AVX512-FP16"),
             ("amx_bf16", "AMX"))


def cpu_name(cpuinfo: Optional[str] = None) -> str:
    """E.g. "AMD EPYC (family 25, model 17; AVX-512, AVX512-BF16; 2 CPUs)". cpuinfo: the text of
    /proc/cpuinfo (read when None); without it, the platform's processor or machine name."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    details = []
    if "cpu family" in fields and "model" in fields:
        details.append(f"family {fields['cpu family']}, model {fields['model']}")
    flags = set(fields.get("flags", "").split())
    features = [label for flag, label in _FEATURES if flag in flags]
    if features:
        details.append(", ".join(features))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    details.append(f"{cpus} CPUs")
    return f"{name} ({'; '.join(details)})"
