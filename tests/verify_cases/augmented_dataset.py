"""A map-style dataset that augments each sample with Python and numpy randomness."""
import random

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class NoisyPoints(Dataset):
    def __init__(self):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 8, generator=generator)
        self.y = torch.randint(0, 2, (64,), generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        jitter = random.gauss(0.0, 0.1) + float(np.random.normal(0.0, 0.1))
        flip = torch.rand(()) < 0.5
        x = self.x[index] + jitter
        return (-x if flip else x), self.y[index]


def main():
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(NoisyPoints(), batch_size=8, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
