"""Expert DDP port of fixtures/amp_gradscaler.py: autocast inside DDP's forward, the GradScaler
stepping the wrapped model's optimizer, rank 0's own loss printed (the conversion prints it so)."""
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import expert_setup
from amp_gradscaler import Classifier


def main():
    rank, _, device = expert_setup.start()
    use_cuda = device.type == "cuda"
    torch.manual_seed(0)
    x = torch.randn(128, 32)
    y = torch.randint(0, 5, (128,))
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, pin_memory=use_cuda)

    model = DDP(Classifier().to(device), device_ids=expert_setup.device_ids(device), gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cuda", enabled=use_cuda)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (inputs, labels) in enumerate(loader):
            inputs = inputs.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=use_cuda):
                loss = criterion(model(inputs), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
    if rank == 0:
        print("done")
    expert_setup.stop()


if __name__ == "__main__":
    main()
