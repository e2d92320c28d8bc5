"""Expert DDP port of bench/overhead_fixtures/compiled_mlp.py: torch.compile applied to the DDP
wrapper (the order the PyTorch docs recommend: DDPOptimizer splits the graph at bucket
boundaries so communication overlaps the backward), the printed loss averaged over the ranks."""
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import expert_setup
from compiled_mlp import Classifier


def main():
    rank, _, device = expert_setup.start()
    torch.manual_seed(0)
    x = torch.randn(256, 32)
    y = torch.randint(0, 5, (256,))
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, drop_last=True)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, drop_last=True, pin_memory=device.type == "cuda")

    model = DDP(Classifier().to(device), device_ids=expert_setup.device_ids(device), gradient_as_bucket_view=True)
    model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for step, (inputs, labels) in enumerate(loader):
            inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(inputs), labels)
            loss.backward()
            optimizer.step()
            if step % 4 == 0:
                (loss_avg,) = expert_setup.mean_over_ranks(loss)
                if rank == 0:
                    print(f"epoch {epoch} step {step} loss {loss_avg:.6f}")
    if rank == 0:
        print("done")
    expert_setup.stop()


if __name__ == "__main__":
    main()
