"""Memory: GPU telemetry (`telemetry`, NVML and torch's allocator), the per-step breakdown by
kind (`breakdown`), snapshots on out-of-memory (`snapshot`), the peak forecast for other
micro-batches (`forecast`, torch-free), the "what fits" levers (`levers`, torch-free) and
activation checkpointing as a lever (`activation_checkpointing`)."""
