"""Expert DDP port of fixtures/grad_accumulation.py: the accumulating backwards run under
no_sync(), so gradients are all-reduced once per optimizer step; the printed loss is the mean over
the ranks, reduced only at the steps that print."""
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import expert_setup
from grad_accumulation import accum_steps, batch_size, epochs


def main():
    rank, _, device = expert_setup.start()
    torch.manual_seed(0)
    x = torch.randn(128, 16)
    y = x[:, :4].sum(dim=1, keepdim=True)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=device.type == "cuda")

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    model = DDP(model, device_ids=expert_setup.device_ids(device), gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    opt_step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        optimizer.zero_grad()
        accumulated = 0.0
        for i, (xb, yb) in enumerate(loader):
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            stepping = (i + 1) % accum_steps == 0
            with contextlib.nullcontext() if stepping else model.no_sync():
                loss = F.mse_loss(model(xb), yb) / accum_steps
                loss.backward()
            accumulated += loss.item()
            if stepping:
                optimizer.step()
                optimizer.zero_grad()
                (accumulated_avg,) = expert_setup.mean_over_ranks(accumulated)
                if rank == 0:
                    print(f"epoch {epoch} step {opt_step} loss {accumulated_avg:.6f}")
                accumulated = 0.0
                opt_step += 1
    if rank == 0:
        print(f"done ({opt_step} optimizer steps)")
    expert_setup.stop()


if __name__ == "__main__":
    main()
