"""What any value from outside may be: the `Range` a setting's number is checked against (each
setting declares its own bounds on its TrainConfig field: engine/declarations/config.py, with
the reasons), the bounds on command rows, and refusals that quote at most a short prefix of
what was given, in one line.

Every value a user can give (a command-line flag, a field in the app, a command row in
run.db's `commands` table, a checkpoint read back) is checked against the one `Range` its
setting declares, so the ways in can never disagree.

Torch-free and import-free: config, commands and the store all use it.
"""
from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass
from typing import Any, Optional, Union

Number = Union[int, float]

# Input from outside the process (run.db command rows) is bounded before it is parsed.
MAX_COMMAND_BYTES = 4096  # a command payload is a few fields; 4 KiB is 50x the largest real one
MAX_COMMAND_DEPTH = 4  # payloads are flat objects; nesting deeper is never a command
MAX_COMMANDS_PER_POLL = 64  # rows read from run.db per poll (the rest wait for the next one)
QUOTE_CHARS = 60  # at most this much of any user text is repeated in a refusal
ERROR_LINE_CHARS = 400  # the `error: ...` line is capped at this many characters


class LimitError(ValueError):
    """Out of range. engine.declarations.config.ConfigError is raised instead where config is imported;
    limits has no imports so that both config and commands can use it."""


@dataclass(frozen=True)
class Range:
    name: str  # the TrainConfig field
    kind: type  # int or float
    low: Number
    high: Number
    high_open: bool = False  # [low, high) rather than [low, high]
    unit: str = ""  # "bytes": bounds are shown as sizes
    note: str = ""  # what a special value means, said with the name ("0 = off")

    @property
    def flag(self) -> str:
        """The command-line flag: the field's name with dashes (engine/declarations/settings.py
        declares the flags the same way)."""
        return "--" + self.name.replace("_", "-")

    def describe(self) -> str:
        lo, hi = self._show(self.low), self._show(self.high)
        if self.kind is int:
            return f"an integer from {lo} to {hi}"
        if self.high_open:
            return f"a number in [{lo}, {hi})"
        return f"a finite number from {lo} to {hi}"

    def _show(self, v: Number) -> str:
        if self.unit == "bytes":
            for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
                if v >= size and v % size == 0:
                    return f"{v // size} {unit}"
            return f"{v} B"
        if isinstance(v, int) and v > 2**20 and v & (v - 1) == 0:
            return f"2**{v.bit_length() - 1}"
        if isinstance(v, int) and v > 10**6 and str(v).rstrip("0") == "1":
            return f"10**{len(str(v)) - 1}"
        return f"{v:g}" if isinstance(v, float) else str(v)

    def ok(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if value < self.low:
            return False
        return value < self.high if self.high_open else value <= self.high

    def check(self, value: Any, who: Optional[str] = None, error: type[Exception] = LimitError) -> Any:
        """The value itself if it is in range; else `error` with one line."""
        if not self.ok(value):
            said = f"{who or self.flag} ({self.note})" if self.note else (who or self.flag)
            raise error(f"{said} must be {self.describe()}, got {quote(value)}")
        return float(value) if self.kind is float else value


# The largest values the run's own counters reach (config.py declares the same bounds for the
# settings: max_steps, epochs, seed).
MAX_STEPS = 10**12
MAX_EPOCHS = 10**6
WHOLE_INT = 2**63 - 1  # what SQLite's INTEGER holds


# Where a run is, as a checkpoint stores it (engine/trainer/progress.py): what a run within the
# ranges above can reach, no more. A checkpoint is input read back (--resume, --fork, a
# rollback), checked by engine/checkpoints/contents.py against these as a flag is against its Range.
_WHOLE_INT = WHOLE_INT
_FINITE = 1.7976931348623157e308  # the largest finite float64
PROGRESS_RANGES: dict[str, Range] = {r.name: r for r in (
    Range("step", int, 0, MAX_STEPS),
    Range("epoch", int, 1, MAX_EPOCHS + 1),  # epochs + 1: every epoch done
    Range("window", int, 0, _WHOLE_INT),
    Range("epoch_offset", int, 0, _WHOLE_INT),
    Range("samples", int, 0, _WHOLE_INT),
    Range("nonfinite_steps", int, 0, MAX_STEPS),
    Range("scaler_skips", int, 0, MAX_STEPS),
    Range("epoch_loss", float, -_FINITE, _FINITE, note="the epoch's sum of loss x count"),
    Range("epoch_count", float, 0.0, _FINITE),
    Range("world_size", int, 1, 2**20),  # ranks: far past any cluster
    # the lr schedule re-planned when the run's length changed (LrSchedule.replanned); 0: as planned
    Range("plan_total", float, 0.0, _FINITE),
    Range("plan_from", float, 0.0, _FINITE),
    Range("plan_factor", float, 0.0, 1.0),
)}


_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxstring = QUOTE_CHARS
_repr.maxother = QUOTE_CHARS
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """A short, one-line, never-raising rendering of user input for a refusal message.

    Strings show at most `limit` characters (then '…'); huge integers are described by their
    size (repr of one with more than 4300 digits raises); containers are cut by depth and
    length, so a deeply nested value cannot recurse."""
    try:
        if isinstance(value, str):
            text = repr(value[:limit]) + ("…" if len(value) > limit else "")
        elif isinstance(value, (bytes, bytearray)):
            text = repr(bytes(value[:limit])) + ("…" if len(value) > limit else "")
        elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
            digits = int(value.bit_length() * math.log10(2)) + 1
            text = f"{'-' if value < 0 else ''}a {digits}-digit integer"
        else:
            text = _repr.repr(value)
    except Exception:  # a user object whose repr fails
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit + 8 else text[:limit] + "…"


def one_line(text: Any, limit: int = ERROR_LINE_CHARS) -> str:
    """Collapse all whitespace (newlines included) to single spaces and cap the length. A
    long message keeps its beginning and its end (where "not writable", "no such file" and
    the like usually are) with '…' for the middle."""
    try:
        s = text if isinstance(text, str) else str(text)
    except Exception:
        s = f"<{type(text).__name__}>"
    s = " ".join(s.split())
    if len(s) <= limit:
        return s
    head = limit * 3 // 5
    return s[:head] + "…" + s[len(s) - (limit - head - 1):]


def json_depth_exceeds(text: str, max_depth: int = MAX_COMMAND_DEPTH) -> bool:
    """True if JSON `text` nests arrays/objects deeper than `max_depth`. A linear scan with no
    recursion, run before json.loads (whose C scanner recurses and raises RecursionError on
    a few thousand brackets)."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif ch in "]}":
            depth -= 1
    return False
