"""The app opens run folders written by the integrations like any other run (one window test)."""
from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = pytest.mark.slow  # three frameworks' runs, then the window

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
pytest.importorskip("pytestqt", reason="pytest-qt is not installed")

from engine.declarations.commands import SetLr  # noqa: E402 - after the importorskip of an optional extra above
from engine.integrations.loop import headroom_run, set_lr  # noqa: E402 - after the importorskip of an optional extra above
from engine.store import RunReader, send_command  # noqa: E402 - after the importorskip of an optional extra above


def _loop_run(path: str) -> str:
    import torch
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with headroom_run(path, config={"epochs": 2}, poll_interval=0) as run:
        for epoch in range(2):
            for i in range(4):
                for cmd in run.poll():
                    run.apply(cmd, lr=set_lr(opt, cmd.lr))
                loss = m(torch.randn(8, 4)).pow(2).mean()
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
                lr = opt.param_groups[0]["lr"]
                opt.step()
                opt.zero_grad()
                run.log_step(loss=loss, grad_norm=norm, lr=lr, micro_batch=8, clip=1.0)
                if epoch == 0 and i == 1:
                    send_command(run.run_dir, SetLr(0.05))  # at="epoch": applies as epoch 2 starts
            run.log_epoch(val_loss=1.0 / (epoch + 1))
    return path


def _hf_run(tmp_path) -> str:
    from integ_helpers import TokenModel, pad_collate, token_data
    from transformers import Trainer, TrainingArguments

    from engine.integrations.transformers import HeadroomCallback
    cb = HeadroomCallback(run_dir=str(tmp_path / "hf"))
    args = TrainingArguments(output_dir=str(tmp_path / "hf-out"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, max_steps=4, report_to="none", use_cpu=True,
                             disable_tqdm=True, save_strategy="no", logging_steps=50)
    trainer = Trainer(model=TokenModel(), args=args, train_dataset=token_data(32), data_collator=pad_collate)
    cb.attach(trainer)
    trainer.train()
    return cb.run_dir


def _lightning_run(tmp_path) -> str:
    import lightning.pytorch as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from engine.integrations.lightning import HeadroomCallback

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
    cb = HeadroomCallback(run_dir=str(tmp_path / "pl"))
    L.Trainer(max_epochs=1, accumulate_grad_batches=2, accelerator="cpu", devices=1, logger=False,
              enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
              default_root_dir=str(tmp_path / "pl-root"), callbacks=[cb]).fit(Tiny(), DataLoader(data, batch_size=4))
    return cb.run_dir


def test_main_window_opens_integration_runs(qtbot, tmp_path):
    from app.core import compat  # noqa: F401 - imported for its effect: before any widget is painted
    from app.main_window import MainWindow

    runs = [_loop_run(str(tmp_path / "loop"))]
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("accelerate"):
        runs.append(_hf_run(tmp_path))
    if importlib.util.find_spec("lightning"):
        runs.append(_lightning_run(tmp_path))
    w = MainWindow(base_config={}, restore_settings=False)
    qtbot.addWidget(w)
    w.show()
    for path in runs:
        rows = RunReader(path).metrics()
        assert rows, path
        assert w.open_run(path), getattr(w, "last_error", "")
        assert len(w.model.metrics) == len(rows), path
        assert w.model.step == rows[-1]["step"] and w.model.state == "finished", path
        assert w.model.info.get("task") == RunReader(path).info()["task"]
        assert w.windowTitle().startswith(os.path.basename(path))  # "NAME - Headroom"
        kinds = w.alerts.kinds()  # where the framework keeps the checkpoints, not "damaged"
        assert "run_damaged" not in kinds and "framework_checkpoints" in kinds, (path, kinds)
        if path.endswith("hf"):  # the mean of micro-batch means of TokenModel: shown, not only in run.db
            assert "loss_weighting" in kinds
    w.open_run(runs[0])
    assert [m for m in w.model.markers if m.changes and m.changes[0][0] == "lr"]  # set_lr drew its marker
    assert [e[3] for e in w.model.epochs] == [1.0, 0.5]  # validation losses per epoch
