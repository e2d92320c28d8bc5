"""Images flattened with the batch size written in as a literal (`x.reshape(8, -1)`, `batch_size=8`): nothing verify can set."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

SAMPLES = 64


def main():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(SAMPLES, 1, 4, 4, generator=generator)
    labels = torch.randint(0, 2, (SAMPLES,), generator=generator)
    loader = DataLoader(TensorDataset(images, labels), batch_size=8, shuffle=True, drop_last=True)
    model = nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            x = x.reshape(8, -1)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
