"""What a Lightning module logs is data, never a reason to stop its training.

A real Lightning fit (CPU) whose module logs "epoch" (the name Lightning's loggers read as the
epoch index) as NaN, inf, a number run.db cannot hold, and its val_loss as NaN: under
HeadroomLogger alone, and beside HeadroomCallback, the fit ends, the run is finished, and the
scalars it could hold are kept at Lightning's own epoch.
"""
from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="the 'lightning' extra is not installed (pip install -e '.[lightning]')")

import lightning.pytorch as L  # noqa: E402 - after the importorskip of an optional extra above
import torch  # noqa: E402 - after the importorskip of an optional extra above
import torch.nn.functional as F  # noqa: E402 - after the importorskip of an optional extra above
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402 - after the importorskip of an optional extra above

from engine.integrations.lightning import HeadroomCallback, HeadroomLogger  # noqa: E402 - after the importorskip of an optional extra above
from engine.integrations.loop import headroom_run  # noqa: E402 - after the importorskip of an optional extra above
from engine.store import RunReader  # noqa: E402 - after the importorskip of an optional extra above


class OddLogs(L.LightningModule):
    def __init__(self, epoch_value: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(6, 3)
        self.epoch_value = epoch_value

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.log("epoch", self.epoch_value)  # what the module calls its epoch: data
        self.log("train_acc", (out.argmax(-1) == y).float().mean())
        return F.cross_entropy(out, y)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", float("nan"))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("with_callback", [False, True], ids=["logger", "logger+callback"])
@pytest.mark.parametrize("epoch_value", [float("nan"), float("inf"), 1e30], ids=["nan", "inf", "1e30"])
def test_a_logged_epoch_that_is_no_index_never_ends_the_fit(tmp_path, monkeypatch, epoch_value, with_callback):
    monkeypatch.setenv("HEADROOM_RUNS", str(tmp_path / "runs"))
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
    lg = HeadroomLogger(run_dir=str(tmp_path / "lg"))
    cb = HeadroomCallback(run_dir=str(tmp_path / "cb")) if with_callback else None
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=lg, log_every_n_steps=1,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=str(tmp_path / "out"),
                        callbacks=[cb] if cb is not None else [])
    trainer.fit(OddLogs(epoch_value), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
    assert trainer.state.finished and trainer.global_step == 8
    r = RunReader(lg.log_dir)
    assert r.info()["status"] == "finished"
    acc = r.scalars(["train_acc"])
    assert len(acc) == 8 and [x["step"] for x in acc] == list(range(8))  # every value kept
    if with_callback:  # the run's epoch (the callback follows Lightning's), not the logged one
        assert [x["epoch"] for x in acc] == [1] * 4 + [2] * 4
        assert [e["epoch"] for e in r.epochs()] == [1, 2]  # both epochs kept; the NaN val_loss is no number


def test_a_loops_scalars_at_a_step_that_is_no_index_are_kept_at_the_current_step(tmp_path):
    with headroom_run(str(tmp_path / "run")) as run:
        run.log_step(1.0, step=3)
        assert run.log_scalars({"acc": 0.5}, step=float("nan"), epoch=float("inf")) == 1
        assert run.log_scalars({"acc": 0.6}, step=torch.tensor([1, 2])) == 1
    assert [(x["step"], x["epoch"], x["value"]) for x in RunReader(str(tmp_path / "run")).scalars(["acc"])] == \
        [(3, 1, 0.5), (3, 1, 0.6)]
