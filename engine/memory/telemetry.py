"""GPU memory telemetry: torch's allocator figures plus NVML's view of the whole device.

NVML counts every process and the CUDA context, so headroom = total - used is what
is really left on the card. NVML numbers devices by PCI bus, torch by
CUDA_VISIBLE_DEVICES order: the two are matched by PCI bus id, never by index.
nvmlInit runs once; all NVML calls happen on the thread that owns the probe.
Without a driver, without NVML, or on CPU: `available` is False and the figures are None.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class MemorySample:
    allocated: Optional[int] = None
    reserved: Optional[int] = None
    peak: Optional[int] = None
    used: Optional[int] = None  # NVML, whole device
    total: Optional[int] = None


NO_GPU = MemorySample()


def _normalise_pci(bus_id: str) -> str:
    """'00000000:3B:00.0' and '0000:3b:00.0' -> '0000:3b:00.0'."""
    bus_id = bus_id.strip().lower()
    domain, _, rest = bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id


class MemoryProbe:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.available = False
        self.reason = "no GPU (CPU device)"
        self._handle = None
        self._nvml = None
        if device.type != "cuda":
            return
        self.available = True
        self.reason = ""
        try:
            import pynvml  # nvidia-ml-py
            pynvml.nvmlInit()
            # torch.cuda.get_device_properties does not create a context on other devices.
            props = torch.cuda.get_device_properties(device)
            want = _normalise_pci(f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0")  # type: ignore[attr-defined]  # torch's stubs lack the pci_* properties
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                bus = pynvml.nvmlDeviceGetPciInfo(h).busId
                bus = bus.decode() if isinstance(bus, bytes) else bus
                if _normalise_pci(bus) == want:
                    self._handle = h
                    self._nvml = pynvml
                    break
            if self._handle is None:
                self.reason = f"NVML has no device at PCI {want}"
        except Exception as e:  # no driver library, no permission...: torch figures only
            self.reason = f"NVML unavailable: {e}"

    def sample(self) -> MemorySample:
        if not self.available:
            return NO_GPU
        used = total = None
        if self._handle is not None and self._nvml is not None:
            info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            used, total = int(info.used), int(info.total)
        else:
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
        stats = torch.cuda.memory_stats(self.device)  # one call: each getter would rebuild this dict
        return MemorySample(allocated=stats.get("allocated_bytes.all.current", 0),
                            reserved=stats.get("reserved_bytes.all.current", 0),
                            peak=stats.get("allocated_bytes.all.peak", 0), used=used, total=total)

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
            self._handle = None


def nvml_status() -> str:
    """'' if NVML answers here, else why not (no driver, no library, ...). Never raises."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
        return ""
    except Exception as e:
        return f"NVML unavailable: {e}"
