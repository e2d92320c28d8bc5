"""Single-GPU training, Trainer-class style, on a dataset that is downloaded on first use (`download=True`).

The trainer, bound at module level, still holds the model when the interpreter exits."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from fakevision import Digits


class Trainer:
    def __init__(self, model, loader, device):
        self.device = device
        self.model = model.to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loader = loader

    def fit(self, epochs):
        for epoch in range(epochs):
            for step, (x, y) in enumerate(self.loader):
                loss = nn.functional.cross_entropy(self.model(x.to(self.device)), y.to(self.device))
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = Digits("data", download=True)
    loader = DataLoader(dataset, batch_size=16, shuffle=True)
    trainer = Trainer(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), loader, device)
    trainer.fit(2)
