"""A wrong Accelerate port of stream.py: the loader is not prepared, so every process trains on the whole stream."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, IterableDataset
from accelerate import Accelerator

accelerator = Accelerator(cpu=not torch.cuda.is_available())


class Stream(IterableDataset):
    def __init__(self, count):
        super().__init__()
        self.count = count

    def __iter__(self):
        generator = torch.Generator().manual_seed(7)
        for _ in range(self.count):
            x = torch.randn(5, generator=generator)
            yield x, x.sum(0, keepdim=True) * 0.5


def main():
    torch.manual_seed(0)
    device = accelerator.device
    loader = DataLoader(Stream(41), batch_size=6)
    model = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)  # wrong: every process trains on all of the data
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
        accelerator.print(f"epoch {epoch} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
