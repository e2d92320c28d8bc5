"""Expert DDP port of fixtures/validation_accuracy.py: each rank evaluates a contiguous, unpadded
run of whole validation batches with the module inside DDP (no collective per batch), and the
correct/total counts are summed over the ranks once per evaluation."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

import expert_setup
from validation_accuracy import synthetic_split


def shard(size: int, batch_size: int, rank: int, world: int) -> range:
    """This rank's contiguous run of whole batches of a dataset of `size` samples."""
    batches = -(-size // batch_size)
    return range(rank * batches // world * batch_size, min((rank + 1) * batches // world * batch_size, size))


def main():
    rank, world, device = expert_setup.start()
    pin = device.type == "cuda"
    torch.manual_seed(0)
    train_ds, val_ds = synthetic_split()
    sampler = DistributedSampler(train_ds, shuffle=True)
    train_loader = DataLoader(train_ds, batch_size=16, sampler=sampler, pin_memory=pin)
    val_loader = DataLoader(Subset(val_ds, shard(len(val_ds), 16, rank, world)), batch_size=16, pin_memory=pin)

    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    model = DDP(model, device_ids=expert_setup.device_ids(device), gradient_as_bucket_view=True)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)

    val_acc = 0.0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        model.train()
        for step, (x, y) in enumerate(train_loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            if step % 4 == 0:
                (loss_avg,) = expert_setup.mean_over_ranks(loss)
                if rank == 0:
                    print(f"epoch {epoch} step {step} loss {loss_avg:.6f}")

        model.eval()
        counts = torch.zeros(2, dtype=torch.int64, device=device)
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                counts[0] += (model.module(x).argmax(dim=1) == y).sum()
                counts[1] += y.size(0)
        dist.all_reduce(counts)
        correct, total = counts.tolist()
        val_acc = correct / total
        if rank == 0:
            print(f"epoch {epoch} val_acc {val_acc:.4f} ({correct}/{total})")
    if rank == 0:
        print(f"final val_acc {val_acc:.4f}")
    expert_setup.stop()


if __name__ == "__main__":
    main()
