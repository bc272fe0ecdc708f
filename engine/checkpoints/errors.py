"""What a checkpoint that cannot be used raises: one line naming the file (a ConfigError: the
command line prints it as `error: ...`, exit 2). Its own module so that every reader of
checkpoint files (files.py, dcp_input.py) raises the same classes without importing each other."""
from __future__ import annotations

from engine.declarations.config import ConfigError


class CheckpointError(ConfigError):
    pass


class CheckpointRefused(CheckpointError):
    """The file holds more than weights (pickled code): never loaded, never skipped silently."""


class CheckpointInvalid(CheckpointRefused):
    """The file loads, but holds values no run can hold (contents.py): a damaged or edited
    file, refused like pickled code (never trained from, never passed over in silence)."""
