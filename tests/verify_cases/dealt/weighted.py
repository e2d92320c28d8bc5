"""Training with a WeightedRandomSampler of its own generator: 50 draws in batches of 8 (a short last batch)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler


def main():
    torch.manual_seed(3)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(40, 4)
    y = (x[:, 0] > 0.8).long()
    weights = (1.0 / torch.bincount(y, minlength=2).float())[y]
    sampler = WeightedRandomSampler(weights, num_samples=50, replacement=True, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, y), batch_size=8, sampler=sampler)
    model = nn.Sequential(nn.Linear(4, 10), nn.ReLU(), nn.Linear(10, 2)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb.to(device)), yb.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
