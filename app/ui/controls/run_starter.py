"""Starting runs from the window: Start (the form's settings under the command-line flags), a
fork (its config from the fork dialog, in a new folder) and Run on N GPUs. Each goes through
the session driver's start or launch; the form's settings are kept as the last config used."""
from __future__ import annotations

from typing import Any, Callable, Optional

from PySide6.QtWidgets import QWidget

from app.core.preferences import Preferences
from app.runner.session_driver import SessionDriver
from app.session.configs import launch_config, launch_dir
from app.session.launch_command import MIN_GPUS, torchrun_command
from engine.declarations.config import ConfigError

from .gpu_dialog import GpuLaunchDialog
from .panel import ControlsPanel


class RunStarter:
    def __init__(self, parent: QWidget, driver: SessionDriver, controls: ControlsPanel,
                 preferences: Preferences, base_config: dict[str, Any], error: Callable[[str, str], Any]) -> None:
        """base_config: the window's command-line flags (the same dict, so later changes count)."""
        self.parent, self.driver, self.controls = parent, driver, controls
        self.preferences, self.base_config, self.error = preferences, base_config, error
        self.dialog: Optional[GpuLaunchDialog] = None  # the last Run on N GPUs dialog opened

    def form(self) -> Optional[dict[str, Any]]:
        """The form's run settings, or None (with a dialog if they are invalid) when no run can start."""
        if self.driver.session.busy:
            return None
        values, err = self.controls.values()
        if values is None:
            self.error("Cannot start", err)
        return values

    def start(self) -> bool:
        values = self.form()
        if values is None or not self.driver.start(self.base_config, values):
            return False
        self.preferences.set_json("last_config", values)
        return True

    def fork(self, config: dict[str, Any]) -> bool:
        """A fork (its TrainConfig fields, fork="DIR@CHECKPOINT") through the same start: in a new
        run folder, whatever --run-dir or --resume the window was given."""
        if self.driver.session.busy:
            self.error("Cannot start the fork", "A run is going in this window: stop it first (or wait for it "
                                                "to end), then fork.")
            return False
        base = {k: v for k, v in self.base_config.items() if k not in ("resume", "run_dir", "fork")}
        if not self.driver.start(base, config):
            return False
        self.controls.set_values(config)  # the form shows what the fork trains with
        return True

    def launch(self, n: int, run_dir: Optional[str] = None, choices: Optional[dict[str, Any]] = None) -> bool:
        """The form's settings under torchrun with n processes; choices: the Run on N GPUs
        dialog's (--strategy, --fsdp-reduce, --cpu-offload), over the form's and the flags'."""
        values = self.form()
        if values is None or self.driver.launch(self.base_config, {**values, **(choices or {})}, n,
                                                    run_dir or "") is None:
            return False
        self.preferences.set_json("last_config", values)
        return True

    def launch_preview(self, n: int, choices: dict[str, Any]) -> tuple[list[str], str]:
        """(the command a launch with these choices runs, its new run folder), as launch() builds
        them. Raises ConfigError when the form's settings cannot start."""
        values, err = self.controls.values()
        if values is None:
            raise ConfigError(err)
        config = launch_config(self.base_config, {**values, **choices})
        folder = launch_dir(config, n)
        return torchrun_command(config, n, folder), folder

    def launch_dialog(self) -> Optional[GpuLaunchDialog]:
        """The Run on N GPUs dialog (window-modal; Start launches). None with fewer than 2 GPUs."""
        count = self.driver.launcher.gpu_count or 0
        if count < MIN_GPUS:
            return None
        d = GpuLaunchDialog(self.parent, count, self.launch_preview, initial=self.base_config)
        d.accepted.connect(lambda: self.launch(d.processes.value(), d.run_dir, d.choices()))
        d.finished.connect(d.deleteLater)
        self.dialog = d
        d.open()
        return d
