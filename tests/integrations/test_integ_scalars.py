"""What frameworks log besides the loss reaches run.db's `scalars` table: the store (and an older
run.db without the table), the Trainer's on_log (compute_metrics, eval_strategy="steps"),
Lightning's callback and HeadroomLogger (alone, and sharing the callback's run folder)."""
from __future__ import annotations

import os
import sqlite3

import pytest
import torch

from engine.store import RunReader, RunStore


def test_store_keeps_finite_numbers_and_an_older_run_db_gains_the_table(tmp_path):
    run = str(tmp_path / "run")
    os.makedirs(run)
    store = RunStore(run)
    n = store.log_scalars(3, 1, {"eval_accuracy": 0.75, "f1": 1, "bad": float("nan"), "flag": True,
                                 "text": "x", "big": float("inf"), "eval_loss": 0.5})
    store.log_scalars(5, 2, {"eval_accuracy": 0.8})
    store.close()
    assert n == 3  # nan, inf, a bool and a string are left out
    r = RunReader(run)
    assert r.scalar_names() == ["eval_accuracy", "eval_loss", "f1"]
    acc = r.scalars(["eval_accuracy"])
    assert [(x["step"], x["epoch"], x["value"]) for x in acc] == [(3, 1, 0.75), (5, 2, 0.8)]
    assert [x["name"] for x in r.scalars(after_rowid=acc[0]["rowid"])] == ["f1", "eval_loss", "eval_accuracy"]
    # A run folder written before the table existed: read as none; opened for writing, it gains it.
    db = sqlite3.connect(os.path.join(run, "run.db"))
    db.execute("DROP TABLE scalars")
    db.commit()
    db.close()
    old = RunReader(run)
    assert old.scalars() == [] and old.scalar_names() == []
    RunStore(run).close()
    assert RunReader(run).scalar_names() == [] and "scalars" in {
        t for (t,) in sqlite3.connect(os.path.join(run, "run.db")).execute("SELECT name FROM sqlite_master")}


def test_trainer_on_log_keeps_compute_metrics_and_step_evaluations(tmp_path):
    pytest.importorskip("transformers", reason="the 'hf' extra is not installed")
    from integ_helpers import TokenModel, pad_collate, token_data
    from transformers import Trainer, TrainingArguments

    from engine.integrations.transformers import HeadroomCallback

    def accuracy(p):
        logits, labels = p.predictions, p.label_ids
        keep = labels != -100
        return {"accuracy": float((logits.argmax(-1)[keep] == labels[keep]).mean())}

    cb = HeadroomCallback(run_dir=str(tmp_path / "run"))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, max_steps=4, eval_strategy="steps", eval_steps=2,
                             logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True, save_strategy="no")
    data = token_data(32)
    trainer = Trainer(model=TokenModel(), args=args, train_dataset=data, eval_dataset=data[:8],
                      data_collator=pad_collate, compute_metrics=accuracy, callbacks=[cb])
    trainer.train()
    r = RunReader(cb.run_dir)
    history = [h for h in trainer.state.log_history if "eval_accuracy" in h]
    acc = r.scalars(["eval_accuracy"])
    assert [(x["step"], x["value"]) for x in acc] == [(h["step"], pytest.approx(h["eval_accuracy"])) for h in history]
    assert [x["step"] for x in acc] == [2, 4]  # evaluations at steps, not epochs
    names = set(r.scalar_names())
    assert {"eval_loss", "loss", "learning_rate", "grad_norm", "train_runtime"} <= names and "epoch" not in names
    assert [x["step"] for x in r.scalars(["loss"])] == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory):
    """Three fits of one small module that logs an accuracy: the callback alone, the logger
    alone, both together."""
    pytest.importorskip("lightning", reason="the 'lightning' extra is not installed")
    import lightning.pytorch as L
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from engine.integrations.lightning import HeadroomCallback, HeadroomLogger

    class Classifier(L.LightningModule):
        def __init__(self, width: int = 5) -> None:
            super().__init__()
            self.save_hyperparameters()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(6, 3)

        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self.net(x)
            self.log("train_acc", (out.argmax(-1) == y).float().mean(), on_step=True, on_epoch=True)
            return F.cross_entropy(out, y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            out = self.net(x)
            self.log("val_loss", F.cross_entropy(out, y))
            self.log("val_acc", (out.argmax(-1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
    tmp = tmp_path_factory.mktemp("scalars")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADROOM_RUNS", str(tmp / "runs"))
        for case in ("callback", "logger", "both"):
            cb = HeadroomCallback(run_dir=str(tmp / f"{case}-cb")) if case != "logger" else None
            lg = HeadroomLogger(run_dir=str(tmp / f"{case}-lg"), task="clf") if case != "callback" else None
            trainer = L.Trainer(max_epochs=2, accumulate_grad_batches=2, accelerator="cpu", devices=1,
                                logger=lg if lg is not None else False, log_every_n_steps=1,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                num_sanity_val_steps=0, default_root_dir=str(tmp / case),
                                callbacks=[cb] if cb is not None else [])
            trainer.fit(Classifier(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
            out[case] = (cb, lg, trainer)
    return out


def test_lightning_callback_keeps_what_the_module_logs(lightning_runs):
    cb, _, trainer = lightning_runs["callback"]
    r = RunReader(cb.run_dir)
    names = set(r.scalar_names())
    assert {"val_acc", "val_loss", "train_acc_epoch"} <= names
    val = r.scalars(["val_acc"])
    assert [(x["epoch"], x["step"]) for x in val] == [(1, 2), (2, 4)]
    assert val[-1]["value"] == pytest.approx(float(trainer.callback_metrics["val_acc"]))


def test_headroom_logger_alone_and_beside_the_callback(lightning_runs):
    from lightning.pytorch.loggers import Logger
    _, lg, trainer = lightning_runs["logger"]
    assert isinstance(lg, Logger) and lg.log_dir.endswith("logger-lg") and lg.version == "logger-lg"
    r = RunReader(lg.log_dir)
    info = r.info()
    assert info["status"] == "finished" and info["task"] == "clf" and info["hparams"] == {"width": 5}
    steps = [x["step"] for x in r.scalars(["train_acc_step"])]
    assert steps == sorted(steps) and len(steps) == 4  # every optimizer step Lightning logged (8 batches, accum 2)
    assert [x["epoch"] for x in r.scalars(["val_acc"])] == [1, 2]
    assert r.metrics() == []  # the logger alone has no per-step rows: the callback writes those
    cb, lg, _ = lightning_runs["both"]
    assert lg.log_dir == cb.run_dir and not os.path.exists(os.path.dirname(cb.run_dir) + "/both-lg")
    r = RunReader(cb.run_dir)
    assert len(r.metrics()) == 4 and len(r.scalars(["train_acc_step"])) == 4
    assert r.info()["hparams"] == {"width": 5}
    assert len(r.scalars(["val_acc"])) == 2  # written once (by the logger), not again by the callback
