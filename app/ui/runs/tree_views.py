"""The run tree and memory levers in the window: forks asked for on a plot or in the run
history go to the fork dialog (forking.py) and start through the window's Start path; the
Compare overlays and "Compare with family" draw other runs (loss, validation, gradient norm, lr,
throughput and their scalars: app/ui/plots/overlays.py) from their fork points
(their axes shifted by what their parents trained before: lineage.axis_offsets), as is the
run shown when it is a fork; the "What fits" table follows the engine's memory_levers and
its choices go along the session's command path."""
from __future__ import annotations

import logging
import math
import os
from typing import Any, Callable, Optional

import numpy as np
from PySide6.QtCore import QObject

from app.core.preferences import Preferences
from app.core.runs import is_run_dir, list_runs
from app.model import lineage
from app.model.stored import measured
from app.model.x_axis import columns
from app.runner.session_driver import SessionDriver
from app.session import remote_runs
from app.session.remote_source import RemoteSource
from app.session.sources import read_metrics
from app.ui.shell.background import Background
from app.ui.shell.remote_fields import host_of, remembered_python
from engine.ctl import client
from engine.ctl.client import default_python, is_remote
from engine.declarations.commands import Command
from engine.store import RunReader, StoreError

from .forking import ForkFlow
from .history import HistoryPanel
from .run_folder_actions import RunFolderActions
from .what_fits import LeversPanel, split_commands

log = logging.getLogger("headroom.tree")


def run_name(path: str) -> str:
    """The name an overlay goes by: the folder's, with its host for a run on another machine."""
    if is_remote(path):
        return f"{host_of(path)}:{os.path.basename(path.partition(':')[2].rstrip('/'))}"
    return os.path.basename(os.path.normpath(path))


def validation(path: str) -> tuple[np.ndarray, np.ndarray]:
    """A run folder's validation loss per epoch: (steps, values); none where it has none or
    cannot be read (the overlay draws its steps all the same)."""
    try:
        with RunReader(path) as reader:
            rows = reader.epochs()
    except StoreError:
        return np.empty(0), np.empty(0)
    pts = [(measured(r.get("step")), measured(r.get("val_loss"))) for r in rows]
    pts = [(s, v) for s, v in pts if math.isfinite(s) and math.isfinite(v)]
    return np.array([s for s, _v in pts], float), np.array([v for _s, v in pts], float)


class RunTreeViews(QObject):
    def __init__(self, driver: SessionDriver, history: HistoryPanel, levers: LeversPanel,
                 plots: Callable[[], Any], start: Callable[[dict[str, Any]], bool],
                 error: Callable[[str, str], Any], parent_widget: Any,
                 continue_run: Optional[Callable[[str], bool]] = None) -> None:
        """plots: the PlotPanel (built on first use); start: the window's start path for a
        config's fields; error: a dialog (title, message); continue_run: the window's Continue
        run for a run folder (the run shown)."""
        super().__init__(driver)
        self.driver, self.session = driver, driver.session
        self.history, self.levers, self._plots, self.error = history, levers, plots, error
        self.forks = ForkFlow(parent_widget, start, error)
        self.background = Background(self)  # another machine's runs and overlays, read over ssh
        self.folder_actions = RunFolderActions(parent_widget, error)  # tags, note, archive, delete, export
        self._continue = continue_run
        s = driver.signals
        history.fork_requested.connect(lambda path, ckpt: self.forks.open(path, ckpt))
        history.overlay_toggled.connect(self.set_overlay)
        history.family_requested.connect(self.compare_family)
        history.compare_cleared.connect(self.clear_compare)
        history.continue_requested.connect(self.continue_run)
        history.export_requested.connect(self.folder_actions.export_weights)
        history.run_action.connect(self.run_action)
        history.remote_refresh_requested.connect(lambda: self.list_host_runs(self.shown_run_dir() or ""))
        self.folder_actions.changed.connect(lambda _path: history.refresh())
        # The table follows this window's runs as they start and end (another process's: its timer).
        s.run_started.connect(lambda *_: history.refresh())  # its end: the window's _on_run_done
        s.run_started.connect(lambda info: self.align_shown(str(info.get("run_dir") or "")))
        driver.folder_opened.connect(self.align_shown)
        driver.folder_opened.connect(self.list_host_runs)
        s.memory_levers.connect(levers.set_levers)
        s.model_replaced.connect(self._on_model_replaced)
        s.state_changed.connect(lambda state: levers.set_live(state.is_live))
        levers.apply_requested.connect(self.send_levers)

    def plots_built(self, panel: Any) -> None:
        self._panel = panel
        panel.fork_requested.connect(self.fork_at_step)
        panel.toolbar.clear_compare.clicked.connect(self.clear_compare)

    # -- forks -----------------------------------------------------------------------------
    def shown_run_dir(self) -> Optional[str]:
        d = self.session.model.info.get("run_dir")
        if not d and self.session.source is not None:
            d = self.session.source.run_dir
        return str(d) if d else None

    def fork_at_step(self, step: int) -> Any:
        """A plot's "Fork from here...": the run shown, from its nearest checkpoint at or before `step`."""
        return self.forks.from_step(self.shown_run_dir(), step)

    def open_last_run(self, preferences: Preferences) -> str:
        """Day two: show the run still training under the runs folder (the newest, if several),
        else the run viewed last on this machine; '' (the window stays empty) when there is
        none, or when something is shown already."""
        if self.shown_run_dir() or self.session.busy:
            return ""
        live = [r.path for r in list_runs(self.history.root) if r.live]
        viewed = [p for p in preferences.recent("recent_runs") if not is_remote(p) and is_run_dir(p)]
        for path in live[:1] or viewed[:1]:
            if self.driver.open(path, remote_python=""):
                self.history.select(path)
                return path
        return ""

    # -- the run table's actions ------------------------------------------------------------------
    def continue_run(self, path: str) -> bool:
        """Continue a run from its last checkpoint: it is shown first (the form takes its
        settings, as Continue run on the run shown does), then continued."""
        if self._continue is None:
            return False
        shown = self.shown_run_dir()
        if (shown is None or os.path.abspath(shown) != os.path.abspath(path)) and not self.driver.open(path):
            return False
        return self._continue(path)

    def run_action(self, action: str, path: str) -> Any:
        """A run table's right-click action on a run: here through its folder, on a server
        through headroom-ctl (tags and note)."""
        run = self.history.summary_of(path)
        if run is None:
            return None
        if is_remote(path):
            return self._remote_labels(action, run)
        acts = self.folder_actions
        if action == "tags":
            return acts.edit_tags(run)
        if action == "note":
            return acts.edit_note(run)
        if action in ("archive", "unarchive"):
            return acts.archive(run, action == "archive")
        if action == "delete":
            return acts.delete(run, self.history.forks_of(path))
        if action == "folder":
            return acts.open_folder(path)
        return None

    def _remote_labels(self, action: str, run: Any) -> Any:
        """Tags and note of a server's run: asked here, written there (headroom-ctl tag over ssh)."""
        host, _, folder = run.path.partition(":")
        target = client.RemoteRun(host, folder)

        def send(**change: Any) -> None:
            self.background.run(lambda: client.label_run(target, remote_python=self.python_for(run.path), **change),
                                lambda out: self._remote_labelled(out), "remote-labels")
        acts = self.folder_actions
        if action == "tags":
            return acts.edit_tags(run, send=send)
        if action == "note":
            return acts.edit_note(run, send=send)
        return None

    def _remote_labelled(self, out: Any) -> None:
        if isinstance(out, Exception):
            self.error("Could not change the run's labels", f"{out}\n\nNothing was changed.")
        else:
            self.list_host_runs(self.shown_run_dir() or "")

    # -- overlays --------------------------------------------------------------------------
    def align_shown(self, run_dir: str) -> None:
        """The run shown is a fork: its samples, tokens and time go on from its parents'."""
        offsets = lineage.axis_offsets(run_dir) if run_dir else {}
        parent = lineage.Parent.from_info(lineage.read_info(run_dir)) if run_dir else None
        cols = columns(self.session.model.metrics)
        panel = self._plots()
        panel.rollbacks.set_fork(*((parent.step, f"{run_name(parent.run_dir)} @{parent.checkpoint}")
                                   if parent is not None else (None,)))
        if offsets != cols.offsets:
            cols.set_offsets(offsets)
            panel.axis_offsets_changed()
        else:
            panel.refresh(force=True)

    def set_overlay(self, path: str, on: bool) -> None:
        panel = self._plots()
        name = run_name(path)
        if not on:
            panel.remove_overlay(name)
            return
        if is_remote(path):  # its rows through its follow over ssh, off the GUI thread
            self.background.run(lambda: remote_runs.read_metrics(path, self.python_for(path)),
                                lambda buf: self._remote_overlay(path, buf), "remote-overlay")
            return
        try:
            buf = read_metrics(path)
        except StoreError as e:
            self.error("Cannot overlay the run", str(e))
            return
        columns(buf).set_offsets(lineage.axis_offsets(path))
        panel.add_overlay(name, buf, run_dir=path, val=validation(path))

    def _remote_overlay(self, path: str, buf: Any) -> None:
        if isinstance(buf, Exception):
            self.history.set_checked(path, False)
            self.error("Cannot overlay the run", str(buf))
        elif path in self.history.checked:  # still wanted (not unticked while it was read)
            self._plots().add_overlay(run_name(path), buf)

    # -- another machine's runs ------------------------------------------------------------
    def python_for(self, target: str) -> str:
        """The python on target's host: the run shown's, if it is there; else the one remembered."""
        src = self.session.source
        if isinstance(src, RemoteSource) and src.remote.host == host_of(target):
            return src.remote_python
        return remembered_python(Preferences(), host_of(target)) or default_python()

    def list_host_runs(self, path: str) -> None:
        """A run on another machine opened: the run history shows that host's runs too (those of a
        host are gone once a run on this machine is opened)."""
        if not is_remote(path):
            self.history.clear_remote()
            return
        host, python = host_of(path), self.python_for(path)
        self.history.set_remote(host, [], "listing...")
        beside = path.partition(":")[2]
        self.background.run(lambda: remote_runs.list_runs(host, python, beside),
                            lambda runs: self._host_runs(host, runs), "remote-runs")

    def _host_runs(self, host: str, runs: Any) -> None:
        if self.history.remote is None or self.history.remote[0] != host:
            return  # another run was opened meanwhile
        if isinstance(runs, Exception):
            self.history.set_remote(host, [], f"could not list them: {runs}")
        else:
            self.history.set_remote(host, runs)

    def _built(self) -> Any:
        return getattr(self, "_panel", None)

    def clear_compare(self) -> None:
        """No run overlaid: every Compare box unticked, every overlay gone (the plots are not
        built for it: with nothing ticked there is nothing on them to take off)."""
        if not self.history.checked:
            panel = self._built()
            if panel is not None and panel.overlays:
                panel.clear_overlays()
            return
        for path in list(self.history.checked):
            self.history.set_checked(path, False)
        self.history.checked.clear()
        panel = self._plots()
        if panel is not None and panel.overlays:
            panel.clear_overlays()

    def compare_family(self, path: str) -> list[str]:
        """Show `path` with its ancestors, siblings and forks overlaid (it is opened first when
        this window is not training; otherwise it is overlaid too)."""
        if is_remote(path):  # no family tree for another machine's runs: the run itself
            self.history.set_checked(path, True)
            return []
        path = os.path.abspath(path)
        shown = self.shown_run_dir()
        if shown is None or os.path.abspath(shown) != path:
            if self.session.busy or not self.driver.open(path):
                self.history.set_checked(path, True)
        family = self.history.family(path)
        for p in family:
            self.history.set_checked(p, True)
        return family

    # -- what fits -------------------------------------------------------------------------
    def _on_model_replaced(self, model: Any) -> None:
        """Another run is shown: the runs compared with the last one go (overlays belong to the
        view they were chosen in)."""
        self.clear_compare()
        self.levers.clear()
        if model.memory_levers is not None:
            self.levers.set_levers({**model.memory_levers.data, "step": model.memory_levers.step})

    def send_levers(self, commands: list[Command], at: str) -> None:
        """The table's choice: micro-batch and accumulation as an Apply of the form would send
        them; checkpointing and precision as they are (a refusal comes back as an alert)."""
        edits, others = split_commands(commands)
        if edits:
            self.driver.apply(edits, at)
        for cmd in others:
            u = self.session.send(cmd)
            self.driver.publish(u)
            if u.error:
                self.error("Could not send the change", f"{u.error}\n\nNothing was sent: the run goes on as it was.")
                return
