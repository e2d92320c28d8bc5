"""Single-GPU script with a light training set and a heavy evaluation set (bench_eval.py's input).

Each epoch trains on 2,048 samples and evaluates 30,001 (loss, accuracy), then prints the metrics and
the epoch's wall and CPU time.
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

DIM, CLASSES = 128, 10


def make_data(n, teacher, generator):
    x = torch.randn(n, DIM, generator=generator)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def evaluate(model, loader, device):
    model.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss_sum += F.cross_entropy(logits, y).item() * y.size(0)
            correct += (logits.argmax(dim=1) == y).sum().item()
            seen += y.size(0)
    return loss_sum / seen, correct / seen


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator().manual_seed(1)
    teacher = torch.randn(DIM, CLASSES, generator=gen)
    train_loader = DataLoader(make_data(2048, teacher, gen), batch_size=64, shuffle=True)
    val_loader = DataLoader(make_data(30001, teacher, gen), batch_size=500)

    model = nn.Sequential(nn.Linear(DIM, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, CLASSES)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(4):
        start, cpu_start = time.perf_counter(), time.process_time()
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        val_loss, val_acc = evaluate(model, val_loader, device)
        print(f"epoch {epoch} val_loss {val_loss:.6f} val_acc {val_acc:.4f} time {time.perf_counter() - start:.3f} cpu {time.process_time() - cpu_start:.3f}")


if __name__ == "__main__":
    main()
