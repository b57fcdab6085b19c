"""Wall-clock timing that is honest about asynchronous devices and memory residency.
Same concept, other floor: ``pipeline/stages/timing.py``."""
from __future__ import annotations

import time
from dataclasses import dataclass

import psutil
import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for queued kernels so a host clock measures the work, not the launch."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


class Stopwatch:
    """Accumulates synchronised elapsed time: ``with sw: ...`` adds to ``sw.seconds``."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> "Stopwatch":
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.seconds += time.perf_counter() - self._t0


@dataclass(frozen=True)
class MemoryPlacement:
    """Where a model's weights live when a time is taken, and whether that time can be trusted."""

    device: str
    param_devices: str
    param_bytes: int
    rss_bytes: int
    device_free_bytes: int | None
    device_total_bytes: int | None
    host_available_bytes: int | None
    trusted: bool
    reason: str


def _host_available_bytes() -> int | None:
    """Memory the host can give without swapping (psutil: MemAvailable on Linux, its equivalent elsewhere)."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None


def _rss_bytes() -> int:
    """This process's resident set size."""
    return int(psutil.Process().memory_info().rss)


def memory_placement(models: list[torch.nn.Module], device: torch.device | str,
                     min_free_fraction: float = 0.02) -> MemoryPlacement:
    """Check every parameter sits on ``device`` and the device (or host) is not out of memory.

    A model whose weights spill to host memory, or a device with no free memory left,
    can run several times slower while every placement check in user code still passes,
    so such timings are flagged as untrusted.
    """
    dev = torch.device(device)
    devices = sorted({str(p.device) for m in models for p in m.parameters()})
    n_bytes = sum(p.numel() * p.element_size() for m in models for p in m.parameters())
    free = total = None
    reasons = []
    if any(torch.device(d).type != dev.type for d in devices):
        reasons.append(f"parameters on {devices}, expected {dev.type}")
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        if free < min_free_fraction * total:
            reasons.append(f"only {free / 2**20:.0f} MiB of {total / 2**20:.0f} MiB free on {dev}")
    host_avail = _host_available_bytes()
    if dev.type == "cpu" and host_avail is not None and host_avail < 512 * 2**20:
        reasons.append(f"host has only {host_avail / 2**20:.0f} MiB available (weights may be paged)")
    return MemoryPlacement(
        device=str(dev), param_devices=",".join(devices), param_bytes=n_bytes, rss_bytes=_rss_bytes(),
        device_free_bytes=free, device_total_bytes=total, host_available_bytes=host_avail,
        trusted=not reasons, reason="; ".join(reasons) or "ok",
    )
