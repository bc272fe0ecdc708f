"""Placeholder until the micro-batch finder lands (issue: GPU memory)."""
from __future__ import annotations

from typing import Any

from .config import ConfigError


def find_micro_batch(trainer: Any) -> None:
    raise ConfigError("--find-micro-batch is not available yet")
