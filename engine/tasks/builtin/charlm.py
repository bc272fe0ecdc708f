"""A small causal Transformer on variable-length text (Python's own documentation,
shipped in data/charlm.txt). Samples hold 9 to 129 characters, so micro-batches
of the same size hold different token counts: the case where normalising by the
window's token count matters.
"""
from __future__ import annotations

from importlib import resources

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.tasks.task import Task

VOCAB = 128  # ASCII
CONTEXT = 128
IGNORE = -100


def _read_text() -> str:
    return resources.files(__package__).joinpath("data/charlm.txt").read_text(encoding="ascii")


def make_samples(text: str, max_len: int = CONTEXT + 1, min_len: int = 9) -> list[torch.Tensor]:
    """Paragraph pieces of variable length; each sample is inputs + one target shift."""
    out: list[torch.Tensor] = []
    for para in text.split("\n\n"):
        para = " ".join(para.split())
        for start in range(0, len(para), max_len):
            piece = para[start:start + max_len]
            if len(piece) >= min_len:
                out.append(torch.tensor([min(ord(c), VOCAB - 1) for c in piece], dtype=torch.long))
    return out


class TextDataset(torch.utils.data.Dataset):
    def __init__(self, samples: list[torch.Tensor]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.samples[i]


def collate(samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to the longest sample; padded targets are IGNORE so they are not counted."""
    T = max(len(s) for s in samples) - 1
    x = torch.zeros(len(samples), T, dtype=torch.long)
    y = torch.full((len(samples), T), IGNORE, dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s) - 1
        x[i, :n] = s[:-1]
        y[i, :n] = s[1:]
    return x, y


def sample_length(sample: torch.Tensor) -> int:
    return len(sample) - 1  # tokens counted by the loss


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A GPT-style decoder; the GPU benchmarks build ANCHORS.md's 135M model from it too."""

    def __init__(self, vocab: int, d: int, L: int, h: int, T: int) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(L))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln(h))


def CharLM() -> GPT:
    return GPT(vocab=VOCAB, d=64, L=2, h=4, T=CONTEXT)


def loss(model: nn.Module, batch):
    x, y = batch
    logits = model(x)
    loss_sum = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1),
                               ignore_index=IGNORE, reduction="sum")
    return loss_sum, (y != IGNORE).sum()  # a device tensor: no sync here


def build_task(seed: int) -> Task:
    samples = make_samples(_read_text())
    torch.manual_seed(seed)
    model = CharLM()
    return Task(model=model, train_data=TextDataset(samples[:3072]), val_data=TextDataset(samples[3072:3328]),
                loss=loss, collate=collate, sample_length=sample_length, name="charlm")
