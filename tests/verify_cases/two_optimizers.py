"""A GAN's shape: two models, each stepped by its own Adam; the second has a bias before a BatchNorm,
whose gradient is zero but for float noise (which Adam turns into whole-sized updates)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    first = nn.Sequential(nn.Linear(8, 2048), nn.ReLU(), nn.Linear(2048, 1))
    second = nn.Sequential(nn.Linear(8, 2), nn.BatchNorm1d(2), nn.ReLU(), nn.Linear(2, 1))
    first_optimizer = torch.optim.Adam(first.parameters(), lr=0.01)
    second_optimizer = torch.optim.Adam(second.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    for epoch in range(2):
        for xb, yb in loader:
            first_optimizer.zero_grad()
            nn.functional.mse_loss(first(xb), yb).backward()
            first_optimizer.step()
            second_optimizer.zero_grad()
            nn.functional.mse_loss(second(xb), yb).backward()
            second_optimizer.step()


if __name__ == "__main__":
    main()
