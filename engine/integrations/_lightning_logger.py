"""`HeadroomLogger`: a Lightning Logger, so `L.Trainer(logger=HeadroomLogger())` works as for
TensorBoard or W&B (behind engine.integrations.lightning, which exports it).

Every metric Lightning logs (`self.log(...)` in any hook, at the step Lightning logs it) is
one row of run.db's `scalars` table; hyperparameters go to the run table (`hparams`).
With `HeadroomCallback` among the Trainer's callbacks the two share one run folder: the
callback's (rows per optimizer step, commands), which it hands to the logger as the run
starts. Alone, the logger writes a run folder of its own holding the scalars, finished by
Lightning's `finalize`; such a run takes no commands (the callback is what steers).
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Mapping, Optional

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from engine.declarations.paths import default_run_dir

from ._step_record import logged_index
from .loop import HeadroomRun, clean

ALONE = "this run is written by HeadroomLogger alone: add HeadroomCallback() to the Trainer's callbacks to steer it"


def _plain(params: Any) -> dict:
    """Hyperparameters (a dict, a Namespace, nested) as plain JSON values."""
    if isinstance(params, argparse.Namespace):
        params = vars(params)
    out: dict[str, Any] = {}
    for k, v in dict(params or {}).items():
        if isinstance(v, Mapping):
            out[str(k)] = _plain(v)
        else:
            v = clean(v)
            out[str(k)] = v if isinstance(v, (int, float, str, bool)) or v is None else repr(v)
    return out


class HeadroomLogger(Logger):
    """Lightning's logged metrics -> a Headroom run folder's `scalars` (see the module doc).

    run_dir: the run folder when the logger writes alone (new; None = a new folder under the
        runs root); with HeadroomCallback the callback's folder is used. task: the runs list's
        name (default "lightning"). config: extra settings for the run table.
    """

    def __init__(self, run_dir: Optional[str] = None, *, task: Optional[str] = None,
                 config: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__()
        HeadroomRun(run_dir, task=task or "lightning", config=config)  # checks the arguments
        self._task = task or "lightning"
        self._run_dir = os.fspath(run_dir) if run_dir is not None else None
        self._config = dict(config or {})
        self._hparams: dict = {}
        self._own: Optional[HeadroomRun] = None  # the run this logger writes alone
        self._shared: Optional[HeadroomRun] = None  # HeadroomCallback's run

    # -- what Lightning asks of a logger -------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._task

    @property
    def version(self) -> str:
        return os.path.basename(os.path.normpath(self.log_dir))

    @property
    def log_dir(self) -> str:
        """The run folder (decided on first use when none was given)."""
        run = self._shared or self._own
        if run is not None and run.run_dir:
            return run.run_dir
        if self._run_dir is None:
            self._run_dir = default_run_dir(self._task)
        return self._run_dir

    @property
    def save_dir(self) -> Optional[str]:
        return None  # Lightning's checkpoints: <default_root_dir>/<name>/<version>/checkpoints

    @property
    def experiment(self) -> Any:
        """The HeadroomRun being written; before it starts (Lightning reads this at set-up, before
        HeadroomCallback's run exists), the logger itself. Never starts a run: the first metric does."""
        return self._shared or self._own or self

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self._hparams.update(_plain(params))
        run = self._shared or self._own
        if run is not None and run.started and not run.finished:
            run.set_info(hparams=self._hparams)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: Optional[int] = None) -> None:
        run = self._run()
        if run.finished:
            return  # logged after the run ended (a test() after fit, say): no run to hold it
        if run is self._own:
            run.poll(block_on_pause=False)  # a command the app sends is refused, saying why (ALONE)
        epoch = logged_index(metrics.get("epoch"))  # Lightning's 0-based epoch, or what the module logged as it
        run.log_scalars({k: v for k, v in metrics.items() if k != "epoch"}, step=logged_index(step),
                        epoch=epoch + 1 if epoch is not None else None)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        own = self._own
        if own is not None and not own.finished:
            if status in ("success", "finished"):
                own.finish("completed")
            else:
                own.fail(f"Lightning ended the run: {status}")

    # -- the run -------------------------------------------------------------------------------------
    def attach(self, run: HeadroomRun) -> None:
        """HeadroomCallback's run: this logger writes there (called as the callback's run starts)."""
        self._shared = run
        if self._hparams:
            run.set_info(hparams=self._hparams)

    def _run(self) -> HeadroomRun:
        run = self._shared or self._own
        if run is None:
            run = HeadroomRun(self.log_dir, task=self._task, config={**self._config, "framework": "lightning"},
                              steering=ALONE, integration="lightning")
            run.start()
            if self._hparams:
                run.set_info(hparams=self._hparams)
            self._own = run
        return run
