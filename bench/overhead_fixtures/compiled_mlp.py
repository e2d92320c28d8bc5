"""A classifier trained through torch.compile (the single-process original of a bench row).

Shape: `model = torch.compile(model)` before the optimizer is built, the usual place in scripts
written for PyTorch 2; batches of one size (drop_last) so the compiled graph is traced once.
"""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self, d_in=32, d_hidden=64, n_out=5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, n_out))

    def forward(self, x):
        return self.net(x)


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(256, 32)
    y = torch.randint(0, 5, (256,))
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, drop_last=True)

    model = Classifier().to(device)
    model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(3):
        for step, (inputs, labels) in enumerate(loader):
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
            if step % 4 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
    print("done")


if __name__ == "__main__":
    main()
