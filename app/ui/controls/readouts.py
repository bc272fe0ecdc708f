"""How the Controls panel words the engine's memory figures: the "what fits" forecast and
the micro-batch finder's choice."""
from __future__ import annotations

from typing import Any

FITS_IDLE = "fits: shown during a GPU run"
FITS_NO_GPU = "fits: no GPU"
FITS_MEASURING = "fits: measuring the first steps..."
FITS_TOOLTIP = "What fits in GPU memory, forecast from the peaks measured so far"


def _mib(n: Any) -> str:
    return f"{float(n or 0) / 2**20:,.0f} MiB"


def fits_text(d: dict[str, Any]) -> str:
    """A memory_forecast event's fields as one line, e.g.
    'fits: micro-batch up to 29 (×3 for 64) · 410 MiB/sample in bf16'."""
    return (f"fits: micro-batch up to {int(d.get('micro_batch_max') or 0):,} "
            f"(\u00d7{int(d.get('accum_for_effective') or 0)} for {int(d.get('effective_batch') or 0):,}) "
            f"\u00b7 {_mib(d.get('per_sample_bytes'))}/sample in {d.get('precision') or '?'}")


def fits_tooltip(d: dict[str, Any]) -> str:
    return (f"Forecast from the peaks measured so far: {_mib(d.get('capacity'))} usable, "
            f"{_mib(d.get('fixed_bytes'))} fixed (weights, gradients, optimizer state, workspace), "
            f"{_mib(d.get('per_sample_bytes'))} of activations per sample in {d.get('precision') or '?'}. "
            f"Micro-batch {int(d.get('micro_batch_max') or 0):,} with accumulation "
            f"{int(d.get('accum_for_effective') or 0)} keeps the effective batch of "
            f"{int(d.get('effective_batch') or 0):,}.")


def fits_at_start(info: dict[str, Any]) -> str:
    """What the readout says once run_started names the device."""
    return FITS_MEASURING if str(info.get("device") or "").startswith("cuda") else FITS_NO_GPU


def finder_text(micro_batch: int, accum: int, probes: int, peak_bytes: int = 0) -> str:
    peak = f", peak {peak_bytes / 2**20:,.0f} MiB" if peak_bytes else ""
    return f"found: micro-batch {micro_batch} \u00d7 accumulation {accum} ({probes} probes{peak})"
