"""The run store: one SQLite database (run.db, WAL) per run folder, written by the one live
writer and read by anyone (the app, `headroom-ctl`, another process following the run).

Torch-free, so the app and the control CLI load it before torch. The interface:
`RunStore` (the writer), `RunReader` (any reader), `send_command` (a command row for a
run in another process), `StoreError`, the file name `DB_NAME` and the metrics columns
`METRIC_COLUMNS`; `runlock` holds the folder's single-writer lock.
"""
from engine.store._reader import RunReader, send_command
from engine.store._run_store import RunStore
from engine.store._tables import DB_NAME, METRIC_COLUMNS, StoreError

__all__ = ["DB_NAME", "METRIC_COLUMNS", "RunReader", "RunStore", "StoreError", "send_command"]
