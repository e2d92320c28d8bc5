"""An old script: its labels go through `np.int`, an alias that numpy 1.24 removed, so every run fails
with an AttributeError whose message goes on for several lines."""
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from toy import FEATURES, TinyMLP


def main():
    torch.manual_seed(0)
    x = torch.randn(64, FEATURES)
    labels = np.arange(64).astype(np.int) % 3
    loader = DataLoader(TensorDataset(x, torch.from_numpy(labels)), batch_size=8, shuffle=True)
    model = TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()


if __name__ == "__main__":
    main()
