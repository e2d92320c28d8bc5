"""Pieces shared by the verify test scripts: seeded synthetic data and a tiny MLP."""
import argparse

import torch
from torch import nn
from torch.utils.data import TensorDataset

FEATURES = 6
CLASSES = 3


def parse_args():
    """Options every test script accepts, so one `-- args` list fits both runs."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--reduction", default="mean")
    parser.add_argument("--batchnorm", action="store_true")
    return parser.parse_args()


def make_dataset(n=64):
    """64 labelled points drawn from a fixed generator, identical in every process."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return TensorDataset(x, y)


class TinyMLP(nn.Module):
    """Two linear layers with dropout, optionally BatchNorm, and a custom method."""

    def __init__(self, hidden=16, batchnorm=False):
        super().__init__()
        norm = nn.BatchNorm1d(hidden) if batchnorm else nn.Identity()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, hidden), norm, nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, CLASSES)
        )

    def forward(self, x):
        return self.net(x)

    def describe(self):
        return f"TinyMLP with {sum(p.numel() for p in self.parameters())} parameters"
