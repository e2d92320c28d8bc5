"""A hand-written DDP port of eval_heavy.py, the way an expert writes it (bench_eval.py's yardstick).

Training: DistributedSampler + set_epoch, DDP. Evaluation: each rank takes every WORLD-th sample
(a strided Subset, no padding) and one all_reduce of [loss_sum, correct, seen] in float64.
"""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

DIM, CLASSES = 128, 10


def make_data(n, teacher, generator):
    x = torch.randn(n, DIM, generator=generator)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def evaluate(model, loader):
    model.eval()
    stats = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for x, y in loader:
            logits = model(x)
            stats += torch.tensor([F.cross_entropy(logits, y).item() * y.size(0), (logits.argmax(dim=1) == y).sum().item(), y.size(0)],
                                  dtype=torch.float64)
    dist.all_reduce(stats)
    loss_sum, correct, seen = stats.tolist()
    return loss_sum / seen, correct / seen


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    teacher = torch.randn(DIM, CLASSES, generator=gen)
    train_set = make_data(2048, teacher, gen)
    val_set = make_data(30001, teacher, gen)
    train_loader = DataLoader(train_set, batch_size=64, sampler=DistributedSampler(train_set, shuffle=True))
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world)), batch_size=500)

    model = nn.Sequential(nn.Linear(DIM, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, CLASSES))
    model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(4):
        start, cpu_start = time.perf_counter(), time.process_time()
        train_loader.sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        val_loss, val_acc = evaluate(model, val_loader)
        if rank == 0:
            print(f"epoch {epoch} val_loss {val_loss:.6f} val_acc {val_acc:.4f} time {time.perf_counter() - start:.3f} cpu {time.process_time() - cpu_start:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
