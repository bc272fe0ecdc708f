"""Values read from what a run folder stores (its run table, events, parent records): input
from disk, so anything may be there (a string, null, a list where an object was meant, an int
past 64 bits, a float infinity that JSON allowed). The one reading is engine/store/stored.py,
which headroom-ctl reads them with too; the app's models import it from here."""
from __future__ import annotations

from engine.store.stored import changes, event_data, mapping, measured, moment, number, text, whole

__all__ = ["number", "whole", "moment", "measured", "mapping", "text", "event_data", "changes"]
