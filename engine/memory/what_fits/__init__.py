"""What fits in memory, torch-free: the peak forecast for other micro-batches (`forecast`), the
"what fits" levers (`levers`) and the sharding rows among them (`sharding`). The app reads a
run's table with these before torch loads; the engine builds the table from its measurements."""
