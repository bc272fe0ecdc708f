"""Forking a run from the window: from a step (a plot's "Fork from here...") or a checkpoint
(the run history's list), to the dialog, to a new run started through the window's Start
path with the fork's TrainConfig (fork="DIR@CHECKPOINT" and the fields edited)."""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QWidget

from app.model import lineage
from engine.declarations.config import TrainConfig, upgrade_keys

from .fork_dialog import FIELDS, ForkDialog

NO_CHECKPOINT = ("A run writes a checkpoint at every epoch's end and when it stops; with "
                 "--checkpoint-every N it also writes one every N steps (the newest --keep-checkpoints "
                 "of those are kept).")


class ForkFlow(QObject):
    def __init__(self, parent: QWidget, start: Callable[[dict[str, Any]], bool],
                 error: Callable[[str, str], Any]) -> None:
        """start: the window's start path for a config's fields; error: a dialog (title, text)."""
        super().__init__(parent)
        self.parent_widget = parent
        self.start = start
        self.error = error
        self.dialog: Optional[ForkDialog] = None  # the one open (or last opened)
        self.started: Optional[dict[str, Any]] = None  # the last fork's config fields, once started

    def from_step(self, run_dir: Optional[str], step: int) -> Optional[ForkDialog]:
        """The nearest checkpoint at or before `step` of the run folder."""
        if not run_dir or not os.path.isdir(run_dir):
            self.error("Cannot fork", "This run has no run folder yet to fork from.")
            return None
        cps = lineage.checkpoints(run_dir)
        ckpt = lineage.nearest(cps, step)
        if ckpt is None:
            have = ", ".join(c.label for c in cps) or "none"
            self.error("No checkpoint to fork from",
                       f"{os.path.basename(os.path.normpath(run_dir))} has no checkpoint at or before step {step:,} "
                       f"(it has: {have}).\n\n{NO_CHECKPOINT}")
            return None
        return self.open(run_dir, ckpt, step)

    def open(self, run_dir: str, ckpt: lineage.Checkpoint, asked: Optional[int] = None) -> ForkDialog:
        """The dialog for a fork of `ckpt`, prefilled with the settings the run had there."""
        info = lineage.read_info(run_dir)
        config = upgrade_keys(info["config"]) if isinstance(info.get("config"), dict) else {}
        at = ckpt.step if ckpt.step is not None else (asked or 0)
        defaults = TrainConfig().to_dict()  # a key an older run did not record: the engine's default
        prefill = {key: config.get(key, defaults.get(key)) for key, _label in FIELDS}
        prefill.update(lineage.settings_at(run_dir, at, config))
        if self.dialog is not None:
            self.dialog.close()
        dlg = ForkDialog(os.path.basename(os.path.normpath(run_dir)), ckpt, prefill, asked, self.parent_widget)
        dlg.fork_wanted.connect(lambda edits: self._start(run_dir, ckpt, config, edits))
        self.dialog = dlg
        dlg.open()
        return dlg

    def _start(self, run_dir: str, ckpt: lineage.Checkpoint, config: dict[str, Any], edits: dict[str, Any]) -> None:
        form = lineage.fork_config(config, edits, ckpt.spec(run_dir))
        if self.start(form):
            self.started = form
