"""Helpers for tests/integrations (imported by name: this folder has no __init__.py, so
no test module can shadow the real `transformers` or `lightning` packages).

Tiny models built from code, data made here: nothing is downloaded.
"""
from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402 - after the environment set-up above
import torch.nn.functional as F  # noqa: E402 - after the environment set-up above

from testkit import ROOT  # noqa: E402,F401 - re-exported: the integration tests import it from here

VOCAB = 24


def token_data(n: int = 48, seed: int = 0, max_len: int = 14) -> list[dict[str, torch.Tensor]]:
    """Sequences of 2..max_len tokens: variable lengths, so token weighting matters."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(2, max_len + 1, (1,), generator=g))
        out.append({"input_ids": torch.randint(0, VOCAB, (length,), generator=g)})
    return out


def pad_collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-padded ids; labels -100 on padding (the Hugging Face convention)."""
    length = max(len(x["input_ids"]) for x in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    labels = torch.full((len(batch), length), -100, dtype=torch.long)
    for i, x in enumerate(batch):
        n = len(x["input_ids"])
        ids[i, :n] = x["input_ids"]
        labels[i, :n] = x["input_ids"]
    return {"input_ids": ids, "labels": labels}


class TokenModel(torch.nn.Module):
    """Predicts each token from itself (no shift): loss = mean over labels != -100.

    Its forward takes no loss kwargs, so the Trainer averages micro-batch means (the
    common case this project measures). `log` holds (loss_sum, count) of every training
    forward, to check the callback's token-weighted loss against; `nan_at` makes the
    loss of that training forward (1-based) NaN.
    """

    def __init__(self, dim: int = 12) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, dim)
        self.out = torch.nn.Linear(dim, VOCAB)
        self.log: list[tuple[float, int]] = []
        self.nan_at = 0

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: Any = None) -> dict:
        logits = self.out(self.emb(input_ids))
        loss_sum = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        n = int((labels != -100).sum())
        if self.training:
            self.log.append((float(loss_sum.detach()), n))
            if self.nan_at and len(self.log) == self.nan_at:
                loss_sum = loss_sum * float("nan")
        return {"loss": loss_sum / n, "logits": logits}


def windows(log: list[tuple[float, int]], accum: int) -> list[tuple[float, int]]:
    """(token-weighted loss, count) per window of `accum` forwards."""
    out = []
    for i in range(0, len(log), accum):
        w = log[i:i + accum]
        n = sum(c for _, c in w)
        out.append((sum(s for s, _ in w) / n, n))
    return out


class ExactTokenModel(TokenModel):
    """The README's exact recipe: the forward takes the Trainer's loss kwargs and divides
    each micro-batch's loss sum by the window's count (`num_items_in_batch`)."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: Any = None,
                num_items_in_batch: Any = None, **kwargs: Any) -> dict:
        out = super().forward(input_ids, labels)
        if num_items_in_batch is not None:
            n = int((labels != -100).sum())
            out["loss"] = out["loss"] * n / num_items_in_batch
        return out


# -- tiny Hugging Face models built from configs (the Trainer's own accumulation cases) -----------------

def text_data(n: int, seed: int, lo: int, hi: int, classes: int = 0) -> list[dict[str, Any]]:
    """Sequences of lo..hi token ids (1..VOCAB-1; 0 pads); with `classes`, a class label each."""
    g = torch.Generator().manual_seed(seed)
    out: list[dict[str, Any]] = []
    for _ in range(n):
        ids = torch.randint(1, VOCAB, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g)
        out.append({"input_ids": ids, "label": int(torch.randint(0, classes, (1,), generator=g))} if classes
                   else {"input_ids": ids})
    return out


def text_collate(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-padded ids and attention mask; a class label per row, or the ids as labels (-100 on padding)."""
    length = max(len(x["input_ids"]) for x in batch)
    ids = torch.zeros(len(batch), length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, x in enumerate(batch):
        n = len(x["input_ids"])
        ids[i, :n], mask[i, :n], labels[i, :n] = x["input_ids"], 1, x["input_ids"]
    out = {"input_ids": ids, "attention_mask": mask}
    out["labels"] = torch.tensor([x["label"] for x in batch]) if "label" in batch[0] else labels
    return out


def tiny_bert(classes: int = 3) -> Any:
    """BertForSequenceClassification from a tiny config (no dropout): its forward takes **kwargs,
    its loss is a plain mean."""
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, num_labels=classes, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def tiny_gpt2() -> Any:
    """GPT2LMHeadModel from a tiny config (no dropout): loss_type unset, so the Trainer counts its
    labels unshifted."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=64,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1,
                                      eos_token_id=1))


def full_batch_grad(model: Any, batch: dict[str, torch.Tensor], causal: bool, smoothing: float = 0.0) -> list[torch.Tensor]:
    """The exact gradient by hand: the whole window as one batch, mean over its true count
    (the labels that are not -100, shifted by one for a causal LM), label-smoothed by `smoothing`."""
    model.train()
    model.zero_grad()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"]
    if causal:
        logits, labels = logits[:, :-1], labels[:, 1:]
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                    label_smoothing=smoothing).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def rel_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """|a - b| / |b| over all tensors."""
    num = sum(float((x - y).double().pow(2).sum()) for x, y in zip(a, b))
    return (num / sum(float(y.double().pow(2).sum()) for y in b)) ** 0.5
