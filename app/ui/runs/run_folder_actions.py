"""What the run table does to a run folder on this machine, each behind the question a person
expects: edit its tags and note (labels.json, engine/store/labels.py, the same file
`headroom-ctl tag/note` writes), archive it (out of the list until "Show archived"), delete
it (to the desktop's trash where there is one, else for good after a second question; never
a run that trains), open it in the file manager, and export a checkpoint's weights
(headroom-export in its own process: the window never imports torch).

Every question is a window-modal dialog that does not block (`self.dialog`, the one open):
the run and the window go on behind it, and a test answers it as a person would."""
from __future__ import annotations

import os
import shutil
import sys
from typing import Any, Callable, Optional

from PySide6.QtCore import QFile, QObject, QProcess, QStandardPaths, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QDialog, QFileDialog, QInputDialog, QMessageBox, QWidget

from app.core.runs import RunSummary, is_live
from app.model import lineage
from engine.declarations.config import ConfigError
from engine.store import labels
from engine.store.labels import fmt_bytes

Error = Callable[[str, str], object]
Yes, Cancel = QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.Cancel


class RunFolderActions(QObject):
    changed = Signal(str)  # a run folder's labels changed, or it went: list the runs again
    exported = Signal(str)  # the file written

    def __init__(self, parent: QWidget, error: Error) -> None:
        super().__init__(parent)
        self.parent_widget, self.error = parent, error
        self.dialog: Optional[QDialog] = None  # the question open now
        self.export_process: Optional[QProcess] = None

    # -- questions that do not block -------------------------------------------------------
    def _ask(self, dialog: QDialog, on_yes: Callable[[], Any]) -> QDialog:
        if self.dialog is not None:
            self.dialog.close()
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(on_yes)
        dialog.finished.connect(lambda *_: setattr(self, "dialog", None) if self.dialog is dialog else None)
        self.dialog = dialog
        dialog.open()
        return dialog

    def _question(self, title: str, text: str, on_yes: Callable[[], Any], warn: bool = False) -> QDialog:
        box = QMessageBox(QMessageBox.Icon.Warning if warn else QMessageBox.Icon.Question, title, text,
                          Yes | Cancel, self.parent_widget)
        box.setDefaultButton(Cancel)
        box.button(Yes).clicked.connect(on_yes)  # a QMessageBox's Yes is not "accepted"
        return self._ask(box, lambda: None)

    # -- labels ----------------------------------------------------------------------------
    def edit_tags(self, run: RunSummary, send: Optional[Callable[..., Any]] = None) -> QDialog:
        """send: how the change is written (default: this machine's labels.change)."""
        write = send or (lambda **change: self.change(run, **change))
        dlg = QInputDialog(self.parent_widget)
        dlg.setWindowTitle("Edit tags")
        dlg.setLabelText(f"Tags of {run.name}, separated by commas:")
        dlg.setTextValue(", ".join(run.labels.tags))
        return self._ask(dlg, lambda: write(tags=[t.strip() for t in dlg.textValue().split(",") if t.strip()]))

    def edit_note(self, run: RunSummary, send: Optional[Callable[..., Any]] = None) -> QDialog:
        write = send or (lambda **change: self.change(run, **change))
        dlg = QInputDialog(self.parent_widget)
        dlg.setWindowTitle("Edit note")
        dlg.setOption(QInputDialog.InputDialogOption.UsePlainTextEditForTextInput)
        dlg.setLabelText(f"Note on {run.name}:")
        dlg.setTextValue(run.labels.note)
        return self._ask(dlg, lambda: write(note=dlg.textValue()))

    def archive(self, run: RunSummary, on: bool = True) -> Optional[QDialog]:
        if not on:
            self.change(run, archived=False)
            return None
        return self._question("Archive run", f"Archive {run.name}?\n\nIt leaves the list; its folder stays as it is "
                              f"({fmt_bytes(run.size)}). Tick \"Show archived\" to see it again.",
                              lambda: self.change(run, archived=True))

    def change(self, run: RunSummary, **change: Any) -> Optional[labels.Labels]:
        try:
            out = labels.change(run.path, **change)
        except ConfigError as e:
            self.error("Could not change the run's labels", f"{e}\n\nNothing was changed.")
            return None
        self.changed.emit(run.path)
        return out

    # -- delete ----------------------------------------------------------------------------
    def delete(self, run: RunSummary, forks: int = 0) -> Optional[QDialog]:
        """Delete the run folder after a question naming what goes; a run that trains is
        refused. `forks`: how many runs forked from it (they keep their folders)."""
        if is_live(run.path):
            self.error("Cannot delete a run that trains",
                       f"{run.name} is training now (its folder has a live writer). Stop it first.")
            return None
        more = (f"\n\n{forks} run{'s' if forks > 1 else ''} forked from it; they keep their own folders and "
                "checkpoints.") if forks else ""
        return self._question("Delete run", f"Delete {run.name}?\n\n{run.path}\n{fmt_bytes(run.size)}: its run.db, "
                              f"metrics and checkpoints go to the trash.{more}", lambda: self._to_trash(run), warn=True)

    def _to_trash(self, run: RunSummary) -> None:
        if is_live(run.path):  # it started training while the question was open
            self.error("Cannot delete a run that trains", f"{run.name} started training; nothing was deleted.")
            return
        try:  # Qt's trash is under the data folder, and gives up where that folder is not there yet
            os.makedirs(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericDataLocation),
                        exist_ok=True)
        except OSError:
            pass
        if QFile.moveToTrash(run.path):
            self.changed.emit(run.path)
            return
        self._question("Delete run for good", f"{run.name} cannot be moved to a trash on this machine.\n\n"
                       "Delete it for good? This cannot be undone.", lambda: self._remove(run), warn=True)

    def _remove(self, run: RunSummary) -> None:
        if is_live(run.path):
            self.error("Cannot delete a run that trains", f"{run.name} started training; nothing was deleted.")
            return
        try:
            shutil.rmtree(run.path)
        except OSError as e:
            self.error("Could not delete the run", f"{run.path}: {e.strerror or e}")
        self.changed.emit(run.path)

    # -- the folder, a checkpoint's weights --------------------------------------------------
    @staticmethod
    def open_folder(path: str) -> bool:
        return QDesktopServices.openUrl(QUrl.fromLocalFile(path))

    def export_weights(self, run_dir: str, ckpt: lineage.Checkpoint, out: str = "") -> Optional[QProcess]:
        """Write the checkpoint's weights with headroom-export (asks where, unless `out`);
        `exported(path)` once written, an error dialog with its line if it refuses."""
        if not out:
            name = os.path.basename(os.path.normpath(run_dir))
            out, _ = QFileDialog.getSaveFileName(self.parent_widget, "Export weights", f"{name}-{ckpt.name}.pt",
                                                 "PyTorch weights (*.pt)")
            if not out:
                return None
        proc = QProcess(self)
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)

        def finished(code: int, _status: object) -> None:
            said = bytes(proc.readAll().data()).decode(errors="replace").strip()
            if code == 0:
                self.exported.emit(out)
            else:
                self.error("Could not export the weights",
                           said.splitlines()[-1] if said else f"headroom-export exited with {code}")
        proc.finished.connect(finished)
        proc.start(sys.executable, ["-m", "engine.export", ckpt.spec(run_dir), out])
        self.export_process = proc
        return proc
