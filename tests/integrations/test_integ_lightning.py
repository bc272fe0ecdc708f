"""HeadroomCallback on a real Lightning Trainer (CPU, a tiny module built here)."""
from __future__ import annotations

import copy
import os

import pytest

pytest.importorskip("lightning", reason="the 'lightning' extra is not installed (pip install -e '.[lightning]')")

import lightning.pytorch as L  # noqa: E402 - after the importorskip of an optional extra above
import torch  # noqa: E402 - after the importorskip of an optional extra above
import torch.nn.functional as F  # noqa: E402 - after the importorskip of an optional extra above
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402 - after the importorskip of an optional extra above

from engine.declarations.commands import SetAccum, SetClip, SetLr, SetMicroBatch, Stop  # noqa: E402 - after the importorskip of an optional extra above
from engine.integrations.lightning import HeadroomCallback  # noqa: E402 - after the importorskip of an optional extra above
from engine.integrations.loop import IntegrationError  # noqa: E402 - after the importorskip of an optional extra above
from engine.store import RunReader, send_command  # noqa: E402 - after the importorskip of an optional extra above

MICRO = 4  # 24 samples: 6 micro-batches an epoch


def token_set(n: int = 24, seed: int = 0) -> TensorDataset:
    """Each sample has 1..8 'tokens' (a mask), so micro-batches carry different counts."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, 6, generator=g)
    y = torch.randint(0, 3, (n, 8), generator=g)
    lengths = torch.randint(1, 9, (n,), generator=g)
    mask = (torch.arange(8)[None, :] < lengths[:, None]).float()
    return TensorDataset(x, y, mask)


class Tokens(L.LightningModule):
    """training_step returns its mean over tokens and the count ('mean'), or, for the README's
    exact recipe ('sum'), the loss sum, with the gradients multiplied by k / the window's
    count in on_before_optimizer_step (Lightning divided them by k)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(6, 3)
        self.reduction = reduction
        self.window = 0.0
        self.micro: list[tuple[float, float]] = []  # (loss_sum, count) per training micro-batch
        self.norms: list[float] = []  # the gradient norm the module sees before Lightning clips
        self.lrs: list[float] = []
        self.vals: list[float] = []

    def loss_sum(self, batch):
        x, y, m = batch
        ce = F.cross_entropy(self.net(x).flatten(0, 1), y.flatten(), reduction="none") * m.flatten()
        return ce.sum(), m.sum()

    def training_step(self, batch, batch_idx):
        s, n = self.loss_sum(batch)
        self.micro.append((float(s.detach()), float(n)))
        if self.reduction == "sum":
            self.window += float(n)
            return {"loss": s, "count": n}
        return {"loss": s / n, "count": n}

    def on_before_optimizer_step(self, optimizer):
        if self.reduction == "sum":
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.trainer.accumulate_grad_batches / self.window)
            self.window = 0.0
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))
        self.lrs.append(float(optimizer.param_groups[0]["lr"]))

    def validation_step(self, batch, batch_idx):
        s, n = self.loss_sum(batch)
        self.vals.append(float(s / n))
        self.log("val_loss", s / n)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1 + 0.5 * t))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _trainer(tmp_path, callbacks, **kw) -> L.Trainer:
    base = dict(max_epochs=2, accumulate_grad_batches=4, gradient_clip_val=0.3, accelerator="cpu", devices=1,
                logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                num_sanity_val_steps=0, default_root_dir=str(tmp_path / "pl"), callbacks=callbacks)
    base.update(kw)
    return L.Trainer(**base)


def _loaders(n: int = 24):
    data = token_set(n)
    return DataLoader(data, batch_size=MICRO), DataLoader(token_set(8, seed=1), batch_size=8)


class Sender(L.Callback):
    """Sends commands right after given optimizer steps (placed before HeadroomCallback)."""

    def __init__(self, headroom: HeadroomCallback, at: dict) -> None:
        self.headroom, self.at, self.seen = headroom, at, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.seen:
            self.seen = trainer.global_step
            for cmd in self.at.get(self.seen, ()):
                send_command(self.headroom.run_dir, cmd)


def _windows(micro, sizes):
    out, i = [], 0
    for k in sizes:
        w = micro[i:i + k]
        i += k
        n = sum(c for _, c in w)
        out.append((sum(s for s, _ in w) / n, n))
    return out


def test_rows_per_optimizer_step_match_the_module(tmp_path):
    module = Tokens()
    cb = HeadroomCallback(run_dir=str(tmp_path / "run"))
    train, val = _loaders()
    _trainer(tmp_path, [cb]).fit(module, train, val)
    r = RunReader(str(tmp_path / "run"))
    rows = r.metrics()
    # 6 micro-batches an epoch at accum 4: a window of 4, then the epoch's short window of 2.
    assert [x["step"] for x in rows] == [1, 2, 3, 4] and [x["epoch"] for x in rows] == [1, 1, 2, 2]
    assert [x["accum"] for x in rows] == [4, 2, 4, 2]
    assert [x["samples"] for x in rows] == [16, 8, 16, 8] and all(x["micro_batch"] == MICRO for x in rows)
    assert [x["grad_norm"] for x in rows] == pytest.approx(module.norms, rel=1e-6)  # before clipping
    assert any(n > 0.3 for n in module.norms)
    assert [x["clipped"] for x in rows] == [int(n > 0.3) for n in module.norms]
    assert [x["lr"] for x in rows] == pytest.approx(module.lrs) and module.lrs[1] < module.lrs[0]
    expected = _windows(module.micro, [4, 2, 4, 2])
    assert [x["loss"] for x in rows] == pytest.approx([l for l, _ in expected], rel=1e-5)
    assert [x["tokens"] for x in rows] == [int(n) for _, n in expected]
    assert r.events(kinds=["loss_weighting"])  # Lightning's mean of means differs from it
    epochs = r.epochs()
    assert [(e["epoch"], e["step"]) for e in epochs] == [(1, 2), (2, 4)]
    assert [e["val_loss"] for e in epochs] == pytest.approx(module.vals)
    info = r.info()
    assert info["status"] == "finished" and info["task"] == "lightning-Tokens" and info["pid"] == os.getpid()
    assert info["integration"] == "lightning" and info["config"]["accum"] == 4 and info["config"]["epochs"] == 2
    assert r.events(kinds=["run_finished"])[0]["data"]["reason"] == "completed"
    assert "on_before_optimizer_step" not in module.__dict__  # the module is left as it was


def test_commands_lr_accum_at_epoch_start_refusal_and_stop_with_a_checkpoint(tmp_path):
    module = Tokens()
    cb = HeadroomCallback(poll_interval=0)  # a new folder under the runs root; commands read every step
    # After step 2 (the end of epoch 1): lr and clip at="step" apply from step 3; the accumulation
    # (at="step" too) waits for the next epoch start as Lightning allows, which is also step 3's.
    sender = Sender(cb, {2: [SetLr(0.05, at="step"), SetAccum(2, at="step"), SetMicroBatch(2),
                             SetClip(0.2, at="step")], 4: [Stop()]})
    train, val = _loaders()
    trainer = _trainer(tmp_path, [sender, cb], max_epochs=5)
    trainer.fit(module, train, val)
    r = RunReader(cb.run_dir)
    rows = r.metrics()
    assert [x["step"] for x in rows] == [1, 2, 3, 4] and trainer.global_step == 4
    assert rows[1]["lr"] != pytest.approx(0.05) and rows[2]["lr"] == pytest.approx(0.05)
    assert rows[3]["lr"] == pytest.approx(0.05 * (1 + 0.5 * 2) / (1 + 0.5 * 3))  # the schedule's shape goes on
    assert [x["accum"] for x in rows] == [4, 2, 2, 2]  # epoch 2 (from step 3) accumulates 2
    assert [x["clip"] for x in rows] == [0.3, 0.3, 0.2, 0.2]
    cmds = {c["kind"]: c for c in r.commands()}
    assert all(cmds[k]["status"] == "applied" for k in ("set_lr", "set_accum", "set_clip", "stop"))
    assert cmds["set_micro_batch"]["status"] == "refused" and "DataLoader" in cmds["set_micro_batch"]["note"]
    [accum_rx] = [e for e in r.events(kinds=["command_received"]) if e["data"]["command"] == "set_accum"]
    assert accum_rx["data"]["applies"] == "epoch" and accum_rx["data"]["target_epoch"] == 2
    changes = [tuple(c) for e in r.events(kinds=["settings_applied"]) for c in e["data"]["changes"]]
    assert ("accum", 4, 2) in changes
    path = cb.stop_checkpoint
    assert path == os.path.join(str(tmp_path / "pl"), "checkpoints", "headroom-stop-step=4.ckpt")
    ckpt = torch.load(path, weights_only=False)
    assert ckpt["global_step"] == 4 and "state_dict" in ckpt and "optimizer_states" in ckpt
    assert not [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".part")]
    assert r.events(kinds=["checkpoint"])[0]["data"]["path"] == path
    assert r.events(kinds=["run_finished"])[0]["data"]["reason"] == "stopped"


def test_exact_recipe_gives_the_whole_window_gradient(tmp_path):
    """README recipe: loss sums, gradients divided by the window's count: the first step's
    gradient is the gradient of the window's 16 samples taken as one batch."""
    module = Tokens("sum")
    twin = copy.deepcopy(module.net)
    cb = HeadroomCallback(run_dir=str(tmp_path / "run"), loss_reduction="sum")
    train, _ = _loaders()
    _trainer(tmp_path, [cb], max_steps=1, gradient_clip_val=None).fit(module, train)
    x, y, m = token_set()[:16]
    ce = F.cross_entropy(twin(x).flatten(0, 1), y.flatten(), reduction="none") * m.flatten()
    whole = ce.sum() / m.sum()
    whole.backward()
    norm = float(torch.nn.utils.get_total_norm([p.grad for p in twin.parameters()]))
    [row] = RunReader(str(tmp_path / "run")).metrics()
    assert row["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert row["loss"] == pytest.approx(float(whole), rel=1e-5) and row["tokens"] == int(m.sum())
    assert RunReader(str(tmp_path / "run")).events(kinds=["loss_weighting"]) == []


def test_nonfinite_loss_and_skipped_micro_batches_are_events(tmp_path):
    class Odd(Tokens):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                return None  # Lightning skips this micro-batch's backward
            out = super().training_step(batch, batch_idx)
            if batch_idx == 5:
                out["loss"] = out["loss"] * float("nan")
            return out

    cb = HeadroomCallback(run_dir=str(tmp_path / "run"))
    train, _ = _loaders()
    _trainer(tmp_path, [cb], max_steps=2, gradient_clip_val=None).fit(Odd(), train)
    r = RunReader(str(tmp_path / "run"))
    rows = r.metrics()
    assert [x["nonfinite"] for x in rows] == [0, 1] and [x["accum"] for x in rows] == [4, 2]
    [skip] = r.events(kinds=["step_skipped"])
    assert skip["step"] == 1 and skip["data"]["micro_batches"] == 1 and "returned None" in skip["message"]
    [nan] = r.events(kinds=["nonfinite"])
    assert nan["step"] == 2 and set(nan["data"]["params"]) == {"net.weight", "net.bias"}
    assert "Lightning stepped" in nan["message"]


def test_bad_arguments():
    with pytest.raises(TypeError, match="run_dir"):
        HeadroomCallback(run_dir=["runs"])
    with pytest.raises(IntegrationError, match="loss_reduction"):
        HeadroomCallback(loss_reduction="avg")
    with pytest.raises(TypeError, match="val_key"):
        HeadroomCallback(val_key="")


class AutoEncoder(L.LightningModule):
    """The autoencoder of Lightning's docs, small: a plain-mean MSE per micro-batch. lr 0, so every
    window's gradient can be checked by hand against the initial weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Sequential(torch.nn.Linear(12, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
        self.decoder = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.ReLU(), torch.nn.Linear(6, 12))
        self.grads: list[list[torch.Tensor]] = []

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return F.mse_loss(self(x), x)

    def on_before_optimizer_step(self, optimizer):
        self.grads.append([p.grad.detach().clone() for p in self.parameters()])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_short_final_window_is_measured_and_summarised_every_epoch(tmp_path):
    """28 samples, micro-batch 4, accumulate 4: each epoch ends with a window of 3 that Lightning
    still divides by 4, so its update is 3/4 of the exact one (-25%), in every epoch."""
    module = AutoEncoder()
    x = torch.randn(28, 12, generator=torch.Generator().manual_seed(0))
    cb = HeadroomCallback(run_dir=str(tmp_path / "run"))
    _trainer(tmp_path, [cb], max_epochs=3, gradient_clip_val=None).fit(module, DataLoader(TensorDataset(x), batch_size=4))
    twin = copy.deepcopy(AutoEncoder())
    F.mse_loss(twin(x[16:]), x[16:]).backward()  # the short window as one batch
    exact = [p.grad for p in twin.parameters()]
    got = module.grads[1]
    ratio = sum(float((g * e).sum()) for g, e in zip(got, exact)) / sum(float(e.pow(2).sum()) for e in exact)
    assert ratio == pytest.approx(0.75, rel=1e-5)  # the error is real
    events = RunReader(str(tmp_path / "run")).events(kinds=["loss_weighting"])
    first, summaries = events[0], events[1:]
    assert first["step"] == 2 and not first["data"]["epoch_summary"]
    assert [(e["epoch"], e["step"], e["data"]["steps"]) for e in summaries] == [(1, 2, 1), (2, 4, 1), (3, 6, 1)]
    for e in events:
        assert e["data"]["grad_scale"] == pytest.approx(ratio, rel=1e-5) and e["data"]["measured"] == "scale"
        assert "short window of 3" in e["data"]["cause"] and "-25.0%" in e["message"]
