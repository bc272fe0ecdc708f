"""Memory: GPU telemetry (`telemetry`, NVML and torch's allocator), the per-step breakdown by
kind (`breakdown`), snapshots on out-of-memory (`snapshot`), activation checkpointing as a
lever (`activation_checkpointing`), and what fits, torch-free (`what_fits`: the peak forecast for
other micro-batches, the "what fits" levers)."""
