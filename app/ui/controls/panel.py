"""The Controls panel: where the run stands, the run settings,
the lr schedule, and the live settings with what became of each change.

A change is sent as a command, to apply at the next epoch or the next step (the "Apply at"
choice); its line then says what the engine says of it: "pending: 8 (sent)", "pending: 8
applies at epoch 3" or "pending: 8 applies at the next step" once the engine has taken it
in, then "applied: ..." or "refused: <reason>". The panel only shows the pending-changes
model (app/model/pending.py); when a change applies is the engine's to say. The fields keep
to the engine's ranges (engine/declarations/limits.py); a value from elsewhere that is out of them is
refused with the engine's own line.
"""
from __future__ import annotations

from typing import Any, Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.core.shortcuts import SHORTCUTS
from app.model.fields import fmt_value
from app.model.pending import ChangeStatus, PendingChanges
from app.model.runmodel import RunModel
from app.model.state import RunState
from app.model.stored import whole
from app.ui.actions import RunActions
from engine.declarations.config import upgrade_keys
from engine.declarations.settings import BY_NAME as SETTINGS_BY_NAME

from .live_fields import APPLY_AT_TEXT, LiveFields
from .readouts import FITS_IDLE, finder_text, fits_at_start, fits_text, fits_tooltip
from .run_fields import RunFields
from .schedule_fields import ScheduleFields

RUNNING = ("starting", "training", "pausing", "paused", "stopping", "reconnecting")
STATE_TEXT = {"idle": "Ready", "starting": "Starting: loading torch and the task...", "training": "Training",
              "pausing": "Pausing after this epoch...",
              "paused": "Paused between epochs: changes apply at once, then Unpause",
              "stopping": "Stopping at the next step (a checkpoint is written)...", "viewing": "Viewing a run folder",
              "reconnecting": "Connection lost: reconnecting (the run trains on; no change reaches it until then)"}


def ended_detail(state: RunState, model: RunModel) -> str:
    """The second line under 'Ready' once a run has ended."""
    return {RunState.FINISHED: f"Last run finished ({model.finish_reason}) at step {model.step:,}.",
            RunState.FAILED: f"Last run failed at step {model.step:,}: {model.finish_reason}",
            RunState.INTERRUPTED: f"This run stopped at step {model.step:,} without finishing (its process ended)."
            }.get(state, "")


class ControlsPanel(QWidget):
    task_file_wanted = Signal()
    edits_changed = Signal()  # what Apply would send changed: the Run actions follow

    def __init__(self, actions: RunActions, pending: PendingChanges, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.pending = pending
        self.state = "idle"  # as set_state was last told: idle, viewing or a live state
        self.remote = False  # the run is in another process (commands through run.db)
        self.run_fields = RunFields()
        self.schedule = ScheduleFields()
        self.live = LiveFields(actions.apply)
        # The form's widgets by setting name (every declared setting with a label has one): the window,
        # the tests and the benchmarks fill the form through them, also as attributes (self.lr, ...).
        rf, lf, sf = self.run_fields, self.live, self.schedule
        self.setting_widgets: dict[str, QWidget] = {
            name: getattr(group, name) for group in (rf, sf, lf) for name in SETTINGS_BY_NAME
            if isinstance(getattr(group, name, None), QWidget)}
        for name, w in self.setting_widgets.items():
            setattr(self, name, w)
        self.apply_at = lf.apply_at
        self.fields, self.effective, self.fits = lf.fields, lf.effective, lf.fits
        self.find_micro_batch, self.finder_status = lf.find_micro_batch, lf.finder_status
        self.apply_button, self.apply_hint = lf.apply_button, lf.apply_hint

        # Start, Pause, Unpause and Stop are the toolbar's (and the Run menu's): shown once, where
        # they stay visible however the panel is scrolled, folded or closed.
        self.run_state = QLabel("Ready")
        self.run_state.setObjectName("hint")
        self.run_state.setWordWrap(True)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.setSpacing(6)
        lay.addWidget(self.run_state)
        lay.addWidget(rf)
        lay.addWidget(sf)
        lay.addWidget(lf)
        lay.addStretch(1)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        rf.task_file_wanted.connect(self.task_file_wanted)
        lf.edited.connect(self._edited)
        self.set_state("idle")

    # -- the form ------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.live.world_size

    @world_size.setter
    def world_size(self, n: int) -> None:
        self.live.world_size = n
        self.live.update_effective()

    @property
    def engine(self) -> dict[str, Any]:
        """The engine's current values of the live fields, as far as it has said."""
        return dict(self.pending.engine)

    def task_spec(self) -> str:
        return self.run_fields.task_spec()

    def set_task(self, spec: str) -> None:
        self.run_fields.set_task(spec)

    def values(self) -> tuple[Optional[dict[str, Any]], str]:
        """The form as TrainConfig fields, or (None, what is wrong)."""
        bad = self.live.invalid_field()
        if bad is not None:
            return None, self.live.problem(bad)
        live = self.live.values()
        fixed, err = self.run_fields.values()
        if fixed is None:
            return None, err
        schedule, err = self.schedule.values()
        if schedule is None:
            return None, err
        out = {**fixed, **schedule, **live, "find_micro_batch": self.find_micro_batch.isChecked()}
        if out["find_micro_batch"]:  # keep the effective batch the form shows; the engine picks the split
            out["effective_batch"] = self.live.micro_batch.value() * self.live.accum.value()
        return out, ""

    def set_values(self, d: dict[str, Any]) -> None:
        d = upgrade_keys(d)  # a config or saved form of an older version
        self.run_fields.set_values(d)
        self.schedule.set_values(d)
        self.live.set_values(d)

    def apply_when(self) -> str:
        """When Apply's changes take effect: "epoch" (the next epoch) or "step" (the next step)."""
        return self.live.at()

    def set_apply_when(self, at: str) -> None:
        self.live.set_at(at)

    # -- where the run stands ------------------------------------------------------------
    def is_running(self) -> bool:
        return self.state in RUNNING

    def set_state(self, state: str, detail: str = "", remote: bool = False) -> None:
        """idle | viewing (a run folder) | starting | training | pausing | paused | stopping."""
        self.state, self.remote = state, remote
        running = self.is_running()
        controllable = running and (not remote or state != "starting")
        self.run_fields.set_running(running)
        self.schedule.set_running(running)
        self.live.set_editable(not running or controllable, not running)
        text = STATE_TEXT.get(state, state)
        if remote and running:
            text += " (run in another process: commands go through its run.db)"
        self.run_state.setText(text + (f"\n{detail}" if detail else ""))
        self._edited()

    # -- edits ---------------------------------------------------------------------------
    def edits(self) -> dict[str, Any]:
        """What Apply would send: the live fields the user edited, where they differ from the
        run's current value (or from a change still on its way). A field the user did not touch
        is never sent, whatever it shows."""
        if not self.is_running() or self.state == "stopping":
            return {}
        return self.pending.edits(self.live.user_edits())

    def edits_ready(self) -> bool:
        return bool(self.edits()) and self.live.invalid_field() is None

    def _edited(self) -> None:
        running = self.is_running() and self.state != "stopping"
        changed = self.edits()
        bad = self.live.invalid_field()
        if not running:
            hint = "During a run: edit, then Apply. Each change then says when the engine applies it."
        elif bad is not None:
            hint = self.live.problem(bad)
        elif changed:
            hint = ("Edited: " + ", ".join(f"{n.replace('_', '-')} {fmt_value(v)}" for n, v in changed.items())
                    + f". Press Apply ({SHORTCUTS['apply']}): it applies at the {APPLY_AT_TEXT[self.apply_when()]}.")
        else:
            hint = ""
        self.apply_hint.setText(hint)
        self.edits_changed.emit()

    # -- the session's news --------------------------------------------------------------
    def on_model_replaced(self) -> None:
        self.live.set_fits_text(FITS_IDLE)
        self.live.show_found("")

    def on_run_started(self, info: dict[str, Any]) -> None:
        self.world_size = whole(info.get("world_size") or 1, 1)
        self.live.set_fits_text(fits_at_start(info))

    def on_micro_batch_found(self, micro_batch: int, accum: int, probes: int, peak_bytes: int) -> None:
        self.live.show_found(finder_text(micro_batch, accum, probes, peak_bytes))

    def on_memory_forecast(self, d: dict[str, Any]) -> None:
        self.live.set_fits_text(fits_text(d), fits_tooltip(d))

    def on_engine_values(self, values: dict[str, Any]) -> None:
        """The form follows the run, except where the user is editing a field or a change is on
        its way."""
        for name, v in values.items():
            if not self.pending.is_pending(name) and name not in self.live.touched:
                self.live.set_field(name, v)
        self._edited()

    def on_pending_changed(self, names: list[str]) -> None:
        for name in names:
            change = self.pending.get(name)
            self.live.show_change(name, change)
            if change is None:
                continue
            if change.status is ChangeStatus.SENT:
                self.live.untouch(name)  # the edit is the run's business now; its line says what becomes of it
            elif change.status in (ChangeStatus.APPLIED, ChangeStatus.REFUSED) and name in self.pending.engine \
                    and name not in self.live.touched:
                self.live.set_field(name, self.pending.engine[name])  # what the engine has now
        self._edited()

    def show_run_values(self, values: dict[str, Any]) -> None:
        """A run's live settings as it has them now (a run folder opened): the live fields show
        them, and none of them counts as an edit."""
        self.live.set_values(values)
        self.live.touched.clear()
        self._edited()

    def status_text(self, name: str) -> str:
        return self.live.status[name].text()
