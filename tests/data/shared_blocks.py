"""Two encoders built around one shared block, each trained as its own model (UNIT-style GANs):
the shared block's parameters belong to both models, so two DDP wrappers hold them."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Encoder(nn.Module):
    def __init__(self, shared_block):
        super().__init__()
        self.own = nn.Linear(4, 8)
        self.shared = shared_block

    def forward(self, x):
        return self.shared(torch.relu(self.own(x)))


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 4)), batch_size=4, shuffle=True)
    shared = nn.Linear(8, 2)
    first = Encoder(shared).to(device)
    second = Encoder(shared).to(device)
    optimizer = torch.optim.SGD(list(first.parameters()) + list(second.parameters()), lr=0.05)
    for epoch in range(2):
        for x1, x2 in loader:
            x1, x2 = x1.to(device), x2.to(device)
            optimizer.zero_grad()
            loss = (first(x1) - second(x2)).pow(2).mean() + first(x1).abs().mean()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
