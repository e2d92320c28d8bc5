"""Expert DDP port of fixtures/real/shape_gan.py: the generator step's backward runs under the
discriminator's no_sync() (the discriminator's gradients from it are cleared before they are
used, so reducing them is wasted), and both printed losses are averaged in one all_reduce."""
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import expert_setup
from shape_gan import LATENT, Discriminator, Generator


def main():
    rank, _, device = expert_setup.start()
    torch.manual_seed(0)
    real = torch.randn(64, 8) * 0.5 + 1.0
    noise = torch.randn(64, LATENT)
    dataset = TensorDataset(real, noise)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, pin_memory=device.type == "cuda")

    ids = expert_setup.device_ids(device)
    netG = DDP(Generator().to(device), device_ids=ids, gradient_as_bucket_view=True)
    netD = DDP(Discriminator().to(device), device_ids=ids, gradient_as_bucket_view=True)
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    criterion = nn.BCEWithLogitsLoss()
    fixed_noise = torch.randn(4, LATENT, device=device)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (x, z) in enumerate(loader):
            x, z = x.to(device, non_blocking=True), z.to(device, non_blocking=True)
            ones = torch.ones(x.size(0), 1, device=device)
            zeros = torch.zeros(x.size(0), 1, device=device)

            optimizerD.zero_grad()
            fake = netG(z)
            lossD = criterion(netD(x), ones) + criterion(netD(fake.detach()), zeros)
            lossD.backward()
            optimizerD.step()

            optimizerG.zero_grad()
            with netD.no_sync():
                lossG = criterion(netD(fake), ones)
                lossG.backward()
            optimizerG.step()
            lossD_avg, lossG_avg = expert_setup.mean_over_ranks(lossD, lossG)
            if rank == 0:
                print(f"epoch {epoch} step {step} lossD {lossD_avg:.6f} lossG {lossG_avg:.6f}")

    with torch.no_grad():
        fake = netG.module(fixed_noise)
    if rank == 0:
        torch.save(fake.cpu(), "samples.pt")
        print(f"saved {fake.shape[0]} samples, mean {fake.mean().item():.6f}")
    expert_setup.stop()


if __name__ == "__main__":
    main()
