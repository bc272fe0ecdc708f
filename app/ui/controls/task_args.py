"""Task arguments (build_task(seed, KEY=VALUE, ...)) as one line of text: KEY=VALUE pairs
separated by spaces, a value with spaces in quotes, each read exactly as the engine reads
`--task-arg KEY=VALUE` (VALUE as JSON where it parses, else the text), with its messages.

AVAILABLE is False while the engine has no task arguments (TrainConfig.task_args)."""
from __future__ import annotations

import json
import shlex
from typing import Any

from engine.declarations import config as engine_config
from engine.declarations.config import ConfigError, TrainConfig

AVAILABLE = ("task_args" in TrainConfig.__dataclass_fields__ and hasattr(engine_config, "parse_task_arg")
             and hasattr(engine_config, "check_task_args"))


def parse(text: str) -> dict[str, Any]:
    """'hidden=256 name="my data"' -> {"hidden": 256, "name": "my data"}. Raises ConfigError
    with the engine's line."""
    try:
        tokens = shlex.split(text)
    except ValueError as e:
        raise ConfigError(f"--task-arg: cannot read {text!r}: {e}") from None
    out: dict[str, Any] = {}
    for token in tokens:
        key, value = engine_config.parse_task_arg(token)
        out[key] = value  # the later one wins, as with repeated flags
    return engine_config.check_task_args(out)


def _as_text(v: Any) -> str:
    if isinstance(v, str):
        try:
            json.loads(v)
        except ValueError:
            return v  # reads back as this text
    return json.dumps(v)


def format_args(args: Any) -> str:
    """The line that parse() reads back as `args`."""
    if not isinstance(args, dict):
        return ""
    return " ".join(shlex.quote(f"{k}={_as_text(v)}") for k, v in args.items())
