"""Expert DDP port of fixtures/batchnorm_cnn.py: SyncBatchNorm on GPUs, pinned batches moved
without blocking, gradients reduced straight from DDP's buckets, the loss printed as its mean over
the ranks (one all_reduce per print, as the conversion prints it)."""
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import expert_setup
from batchnorm_cnn import SmallCNN


def main():
    rank, _, device = expert_setup.start()
    torch.manual_seed(0)
    images = torch.randn(64, 1, 8, 8)
    labels = torch.randint(0, 3, (64,))
    dataset = TensorDataset(images, labels)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, pin_memory=device.type == "cuda")

    model = SmallCNN().to(device)
    if device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=expert_setup.device_ids(device), gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        model.train()
        for step, (img, lbl) in enumerate(loader):
            img, lbl = img.to(device, non_blocking=True), lbl.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(img), lbl)
            loss.backward()
            optimizer.step()
            (loss_avg,) = expert_setup.mean_over_ranks(loss)
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss_avg:.6f}")

    bn = model.module.features[1]
    if rank == 0:
        print(f"bn running_mean[0] {bn.running_mean[0].item():.6f}")
        print("done")
    expert_setup.stop()


if __name__ == "__main__":
    main()
