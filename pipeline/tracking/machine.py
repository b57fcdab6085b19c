"""The machine a job measures on, in words: timings compare only within one machine."""
from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity mask on this platform
        return os.cpu_count() or 1


def describe(device: str) -> str:
    """``<cpu model>, <n> cores`` and, on CUDA, the GPU's name first (what a result's provenance records)."""
    cpu = f"{cpu_model()}, {usable_cores()} cores"
    if str(device).startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(torch.device(device))} ({cpu})"
    return cpu
