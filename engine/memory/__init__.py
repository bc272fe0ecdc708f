"""Memory: GPU telemetry (`telemetry`, NVML and torch's allocator), the per-step breakdown by
kind (`breakdown`), snapshots on out-of-memory (`snapshot`), activation checkpointing as a
lever (`activation_checkpointing`), and the torch-free memory plan (`plan`: the peak forecast for
other micro-batches, the "what fits" levers)."""
