"""The "What fits" table: the engine's latest memory_levers event (engine/memory/what_fits/levers.py) as a grid,
one row per micro-batch (with the accumulation that keeps the effective batch), one column
per precision x activation checkpointing; each cell the predicted peak and whether it fits.
Where a number comes from shows on the cell: measured or fit from this state's own steps
plainly, extrapolated from another state in italics with "≈" on a hatched background,
unknown as a dash. The run's own cell is bold ("● now").

Below it, where the machine has 2 or more GPUs or the run is distributed, the sharding levers
(engine/memory/what_fits/sharding.py): FSDP over N GPUs, its reduction, CPU offload, each row an
estimate from the measured breakdown (said in its text and tooltip). They need a new launch
(Run on N GPUs...), so they are shown, not applied.

Choosing a cell and pressing "Apply at next step" or "Apply at next epoch" asks for the
commands that move the run there (engine.memory.what_fits.levers.commands_for); the window sends them along
the session's command path, so each change and any refusal shows as for any setting."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine.declarations.commands import Command, setting_of
from engine.memory.what_fits import levers
from engine.memory.what_fits.sharding import ShardingRow

IDLE = "What fits shows here during a run on a GPU: the engine builds it from the peaks it measures."
CELL_ROLE = Qt.ItemDataRole.UserRole
FIT_BG, NOFIT_BG, UNKNOWN_BG = QColor(34, 197, 94, 45), QColor(220, 38, 38, 40), QColor(148, 163, 184, 30)


def _gib(n: Optional[int]) -> str:
    return "?" if n is None else f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def cells_of(data: dict[str, Any]) -> list[levers.Cell]:
    """A memory_levers event's rows as engine.memory.what_fits.levers cells (rows from run.db are JSON lists)."""
    out = []
    for row in data.get("rows") or ():
        try:
            micro, prec, ckpt, peak, fits, accum, source, current, available = row
            out.append(levers.Cell(micro_batch=int(micro), precision=str(prec), checkpointing=bool(ckpt),
                                   predicted_peak=None if peak is None else int(peak),
                                   fits=None if fits is None else bool(fits), accum=int(accum),
                                   effective_batch=int(micro) * int(accum), source=str(source),
                                   current=bool(current), available=bool(available)))
        except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
            continue  # a damaged row: left out
    return out


def sharding_of(data: dict[str, Any]) -> list[ShardingRow]:
    """A memory_levers event's sharding rows (none in runs from before them; damaged ones left out)."""
    out = []
    for row in data.get("sharding") or ():
        try:
            out.append(ShardingRow.from_row(row))
        except (TypeError, ValueError):
            continue
    return out


SHARDING_COLUMNS = ("Layout (estimate)", "Peak per GPU", "Largest micro-batch", "Micro-batch \u00d7 accum",
                    "Host memory per rank")


def sharding_texts(r: ShardingRow) -> tuple[str, ...]:
    """One sharding row's cells: every figure marked as the estimate it is."""
    mark = {True: " \u2713", False: " \u2717", None: ""}[r.fits]
    peak = "\u2014" if r.predicted_peak is None else f"\u2248 {_gib(r.predicted_peak)}{mark} (estimate)"
    largest = "\u2014" if r.largest is None else f"\u2248 {r.largest}"
    return (r.label + ("  \u25cf now" if r.current else ""), peak, largest, f"{r.micro_batch} \u00d7 {r.accum}",
            _gib(r.host_bytes) if r.host_bytes else "\u2014")


def split_commands(cmds: list[Command]) -> tuple[dict[str, Any], list[Command]]:
    """(edits of the form's live fields, the other commands): micro-batch and accumulation go
    the way an Apply of the form goes (their pending line says what became of them);
    checkpointing and precision are sent as they are (the engine's answer is an event)."""
    edits: dict[str, Any] = {}
    others: list[Command] = []
    for c in cmds:
        f = setting_of(c.kind)
        if f is not None:
            edits[f.name] = getattr(c, f.name)
        else:
            others.append(c)
    return edits, others


def cell_text(c: levers.Cell) -> str:
    if c.predicted_peak is None:
        return "\u2014"
    mark = {True: " \u2713", False: " \u2717", None: ""}[c.fits]
    return ("\u2248 " if c.source == "extrapolated" else "") + _gib(c.predicted_peak) + mark + \
        ("  \u25cf now" if c.current else "")


class LeversPanel(QWidget):
    apply_requested = Signal(list, str)  # (engine commands, "step" | "epoch")

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.cells: list[levers.Cell] = []
        self.current: Optional[levers.Current] = None
        self.live = False
        self.summary = QLabel(IDLE)
        self.summary.setObjectName("hint")
        self.summary.setWordWrap(True)
        self.table = QTableWidget(0, 0)
        self.table.setObjectName("what_fits")
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectItems)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._sync_buttons)
        self.notes = QLabel("")
        self.notes.setObjectName("hint")
        self.notes.setWordWrap(True)
        self.sharding: list[ShardingRow] = []
        self.sharding_label = QLabel("Sharding over this machine's GPUs: estimates from the measured parameters, "
                                     "gradients and optimizer state (a new launch: Run on N GPUs...)")
        self.sharding_label.setObjectName("hint")
        self.sharding_label.setWordWrap(True)
        self.sharding_table = QTableWidget(0, len(SHARDING_COLUMNS))
        self.sharding_table.setObjectName("what_fits_sharding")
        self.sharding_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.sharding_table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.sharding_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.sharding_table.verticalHeader().setVisible(False)
        self.step_button = QPushButton("Apply at next step")
        self.epoch_button = QPushButton("Apply at next epoch")
        for b, at in ((self.step_button, "step"), (self.epoch_button, "epoch")):
            b.setToolTip(f"Send the chosen cell's micro-batch, accumulation and checkpointing to the run, "
                         f"to apply at the next {at}")
            b.clicked.connect(lambda _c=False, at=at: self._apply(at))
        legend = QLabel("\u2713 fits \u00b7 \u2717 does not \u00b7 \u2248 italic: extrapolated from another "
                        "precision or checkpointing state \u00b7 \u2014 not known yet")
        legend.setObjectName("hint")
        row = QHBoxLayout()
        row.addWidget(legend, 1)
        row.addWidget(self.step_button)
        row.addWidget(self.epoch_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.summary)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.sharding_label)
        lay.addWidget(self.sharding_table, 1)
        lay.addWidget(self.notes)
        lay.addLayout(row)
        self._set_sharding([])
        self._sync_buttons()

    # -- the table -------------------------------------------------------------------------
    def clear(self) -> None:
        self.cells, self.current = [], None
        self.table.clear()
        self.table.setRowCount(0)
        self.table.setColumnCount(0)
        self.summary.setText(IDLE)
        self.notes.setText("")
        self._set_sharding([])
        self._sync_buttons()

    def set_levers(self, data: dict[str, Any]) -> None:
        """The fields of a memory_levers event."""
        self.cells = cells_of(data)
        now = next((c for c in self.cells if c.current), None)
        self.current = (levers.Current(micro_batch=now.micro_batch, accum=now.accum, precision=now.precision,
                                       checkpointing=now.checkpointing) if now is not None else None)
        chosen = self.chosen()
        micros = sorted({c.micro_batch for c in self.cells})
        states = list(dict.fromkeys(c.state for c in self.cells))
        t = self.table
        t.clear()
        t.setRowCount(len(micros))
        t.setColumnCount(len(states))
        t.setHorizontalHeaderLabels([f"{p}\ncheckpointing {'on' if ck else 'off'}" for p, ck in states])
        accum = {c.micro_batch: c.accum for c in self.cells}
        t.setVerticalHeaderLabels([f"micro-batch {m} \u00d7 accum {accum[m]}" for m in micros])
        for c in self.cells:
            t.setItem(micros.index(c.micro_batch), states.index(c.state), self._item(c))
        cap, usable = data.get("capacity"), data.get("usable")
        self.summary.setText(f"What fits: {_gib(usable)} usable of {_gib(cap)}, from the peaks measured at step "
                             f"{data.get('step', '?')} (measured and fit: this state's own steps)."
                             if cap is not None else "What fits: no capacity known (not a GPU run)")
        self.notes.setText("; ".join(str(n) for n in data.get("notes") or ()))
        self._set_sharding(sharding_of(data))
        if chosen is not None:
            self.select(chosen.micro_batch, chosen.precision, chosen.checkpointing)
        self._sync_buttons()

    def _item(self, c: levers.Cell) -> QTableWidgetItem:
        item = QTableWidgetItem(cell_text(c))
        item.setData(CELL_ROLE, c)
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        font = QFont()
        font.setItalic(c.source == "extrapolated")
        font.setBold(c.current)
        item.setFont(font)
        bg = QBrush(UNKNOWN_BG if c.fits is None else FIT_BG if c.fits else NOFIT_BG)
        if c.source == "extrapolated":
            bg.setStyle(Qt.BrushStyle.BDiagPattern)
        item.setBackground(bg)
        tip = f"{c.source}" + (f": {c.basis}" if c.basis else "")
        if not c.available:
            item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled & ~Qt.ItemFlag.ItemIsSelectable)
            tip = "activation checkpointing has no switch for this model"
        item.setToolTip(tip)
        return item

    def _set_sharding(self, rows: list[ShardingRow]) -> None:
        self.sharding = rows
        t = self.sharding_table
        t.clearContents()
        t.setRowCount(len(rows))
        t.setHorizontalHeaderLabels(list(SHARDING_COLUMNS))
        for i, r in enumerate(rows):
            for j, text in enumerate(sharding_texts(r)):
                item = QTableWidgetItem(text)
                item.setToolTip(r.basis)  # "estimate: ... measured at micro-batch B ..."
                font = QFont()
                font.setItalic(True)  # as the extrapolated cells: not a measurement
                font.setBold(r.current)
                item.setFont(font)
                if j == 1:
                    item.setBackground(QBrush(UNKNOWN_BG if r.fits is None else FIT_BG if r.fits else NOFIT_BG))
                t.setItem(i, j, item)
        self.sharding_label.setVisible(bool(rows))
        t.setVisible(bool(rows))

    def cell_at(self, row: int, col: int) -> Optional[levers.Cell]:
        item = self.table.item(row, col)
        return item.data(CELL_ROLE) if item is not None else None

    def select(self, micro_batch: int, precision: str, checkpointing: bool) -> bool:
        """Choose a cell (as a click does). False if the table has no such cell."""
        for r in range(self.table.rowCount()):
            for col in range(self.table.columnCount()):
                c = self.cell_at(r, col)
                if c is not None and (c.micro_batch, c.precision, c.checkpointing) == (micro_batch, precision,
                                                                                      checkpointing):
                    self.table.setCurrentCell(r, col)
                    return True
        return False

    def chosen(self) -> Optional[levers.Cell]:
        items = self.table.selectedItems()
        return items[0].data(CELL_ROLE) if items else None

    # -- applying --------------------------------------------------------------------------
    def set_live(self, live: bool) -> None:
        self.live = live
        self._sync_buttons()

    def commands(self, at: str) -> list[Command]:
        """What moves the run to the chosen cell, to apply at `at` (empty: nothing to change)."""
        c = self.chosen()
        if c is None or self.current is None or not c.available:
            return []
        return [replace(cmd, at=at) for cmd in levers.commands_for(c, self.current)]

    def _sync_buttons(self) -> None:
        ok = self.live and bool(self.commands("epoch"))
        self.step_button.setEnabled(ok)
        self.epoch_button.setEnabled(ok)

    def _apply(self, at: str) -> None:
        cmds = self.commands(at)
        if cmds:
            self.apply_requested.emit(cmds, at)
