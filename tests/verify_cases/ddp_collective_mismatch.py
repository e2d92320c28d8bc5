"""Planted bug: at the start of epoch 2 rank 0 alone all-reduces a 1-element tensor while rank 1 all-reduces its
gradients: gloo finds the sizes mismatched and aborts rank 0 (SIGABRT, no Python traceback)."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from toy import TinyMLP, make_dataset, parse_args


def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = TinyMLP(batchnorm=args.batchnorm).to(device)
    if dist.get_rank() == 0:
        print(model.describe())
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss(reduction=args.reduction)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        if dist.get_rank() == 0 and epoch == 1:
            dist.all_reduce(torch.ones(1))  # BUG: rank 1 runs another collective
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
