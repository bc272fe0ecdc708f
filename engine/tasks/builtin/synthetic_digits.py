"""A deterministic 10-class image data set made on the fly (no download).

Each class is a fixed random 28x28 prototype of blurred strokes; samples are the
prototype, shifted by up to 2 pixels, plus noise. Learnable in an epoch, not trivial.
"""
from __future__ import annotations

import torch

DATA_SEED = 1234


class DigitsDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, split_seed: int, flat: bool) -> None:
        g = torch.Generator().manual_seed(DATA_SEED)
        protos = torch.rand(10, 1, 28, 28, generator=g)
        protos = torch.nn.functional.avg_pool2d(protos, 5, stride=1, padding=2)
        protos = (protos - protos.mean()) / protos.std()
        g = torch.Generator().manual_seed(DATA_SEED + split_seed)
        self.y = torch.randint(0, 10, (n,), generator=g)
        shifts = torch.randint(-2, 3, (n, 2), generator=g)
        x = protos[self.y].clone()
        for i in range(n):
            x[i] = torch.roll(x[i], shifts=(int(shifts[i, 0]), int(shifts[i, 1])), dims=(1, 2))
        x += 3.0 * torch.randn(x.shape, generator=g)
        self.x = x.reshape(n, 784) if flat else x

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]
