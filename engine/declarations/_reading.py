"""Reading what a user types: a flag's text, a task argument, a memory size. Each either
returns the value or raises ConfigError with one line for `error: ...`; none of them
checks a range (the field's declaration does: engine/declarations/config.py).

Torch-free: the app imports this at start-up.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

from . import limits


class ConfigError(ValueError):
    """A value the user gave is out of range; the message is one line for `error: ...`."""


def read_text(text: str) -> str:
    return str(text)


def read_int(text: str) -> int:
    """A whole number. The range is validate()'s; this only reads it, quoting at most a prefix."""
    try:
        if len(text) > 100:  # no run needs a 100-digit number; int() of 5000 digits raises
            raise ValueError
        return int(text)
    except ValueError:
        raise ConfigError(f"not an integer: {limits.quote(text)}") from None


def read_float(text: str) -> float:
    try:
        v = float(text) if len(text) <= 100 else math.nan
    except ValueError:
        raise ConfigError(f"not a number: {limits.quote(text)}") from None
    if not math.isfinite(v):
        raise ConfigError(f"not a finite number: {limits.quote(text)}")
    return v


def read_on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ConfigError(f"expected on or off, got {limits.quote(text)}")
    return text == "on"


def read_workers(text: str) -> Optional[int]:
    return None if str(text).strip().lower() == "auto" else read_int(text)


def read_kept(text: str) -> Optional[int]:
    """How many checkpoints to keep: a whole number, or `all` (None: every one)."""
    if str(text).strip().lower() == "all":
        return None
    try:
        return read_int(text)
    except ConfigError:
        raise ConfigError(f"expected a whole number or all, got {limits.quote(text)}") from None


def read_task_arg(text: str) -> tuple[str, Any]:
    try:
        return parse_task_arg(text)
    except ConfigError as e:  # the flag is named by whoever reads it
        raise ConfigError(str(e).removeprefix("--task-arg: ").removeprefix("--task-arg ")) from None


MAX_TASK_ARGS = 64  # options of one task; more is not a configuration
MAX_TASK_ARG_CHARS = 1024  # one value as JSON text: options, not data


def check_task_args(args: Any) -> dict[str, Any]:
    """Task arguments are keyword arguments of build_task: identifiers, JSON-able values."""
    if not isinstance(args, dict):
        raise ConfigError(f"--task-arg: task arguments must be KEY=VALUE pairs, got {limits.quote(args)}")
    if len(args) > MAX_TASK_ARGS:
        raise ConfigError(f"--task-arg: at most {MAX_TASK_ARGS} task arguments, got {len(args)}")
    for k, v in args.items():
        if not (isinstance(k, str) and k.isidentifier() and k != "seed"):
            raise ConfigError(f"--task-arg: {limits.quote(k)} is not a keyword name (letters, digits, _; not seed)")
        try:
            text = json.dumps(v)
        except (TypeError, ValueError):
            raise ConfigError(f"--task-arg {k}: the value must be plain data (JSON), got {limits.quote(v)}") from None
        if len(text) > MAX_TASK_ARG_CHARS:
            raise ConfigError(f"--task-arg {k}: the value is {len(text)} characters (at most {MAX_TASK_ARG_CHARS})")
    return args


def parse_task_arg(text: str) -> tuple[str, Any]:
    """'KEY=VALUE' -> (KEY, VALUE), VALUE as a JSON literal where it parses, else the string."""
    key, sep, raw = str(text).partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--task-arg must be KEY=VALUE, got {limits.quote(text)}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    check_task_args({key: value})
    return key, value


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
          "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4}


def parse_size(text: str) -> int:
    """'24GiB' -> bytes. Accepts B, K/M/G/T (powers of 1000) and Ki/Mi/Gi/Ti (powers of 1024).

    Exact arithmetic (no float): a 400-digit number is a (huge) int, never an overflow; the
    range a run can use is checked by validate() (engine/declarations/limits.py)."""
    text = str(text)
    m = _SIZE.match(text) if len(text) <= 200 else None
    if not m:
        raise ConfigError(f"cannot read a memory size from {limits.quote(text)} (try 24GiB)")
    unit = (m.group(2) or "").upper().rstrip("B")
    whole, _, frac = m.group(1).partition(".")
    value: int = (int(whole) * 10**len(frac) + int(frac or 0)) * _UNITS[unit] // 10**len(frac)
    if value < 1:
        raise ConfigError(f"memory size must be positive, got {limits.quote(text)}")
    return value
