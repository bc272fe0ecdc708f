"""One optimizer step as one accumulation window: the sample order and its split into
micro-batches (`sampling`, `policy`), loading them (`feeder`), the micro-batches' backwards
(`accumulate`), the step after the last one (`step`: unscale, norm, non-finite check, clip,
optimizer step; `grads`) and recovery from an out-of-memory error (`oom`)."""
