"""The batch size of an argparse option, written into a shape: `x.reshape(args.batch_size, -1)`."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(64, 1, 4, 4, generator=generator)
    labels = torch.randint(0, 2, (64,), generator=generator)
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for x, y in loader:
            x = x.reshape(args.batch_size, -1)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
