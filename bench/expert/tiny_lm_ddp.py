"""Expert DDP port of fixtures/fsdp/tiny_transformer.py: the language model in DDP with
gradients reduced from its buckets, the step loss averaged over the ranks for its print, rank 0
saving the best checkpoint (every rank judges `best` on its own shard's total, as the conversion
does)."""
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import expert_setup
from tiny_transformer import CONTEXT, VOCAB, TinyLM


def main():
    rank, _, device = expert_setup.start()
    torch.manual_seed(0)
    corpus = torch.randint(0, VOCAB, (64, CONTEXT + 1))
    dataset = TensorDataset(corpus[:, :-1], corpus[:, 1:])
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, pin_memory=device.type == "cuda")

    model = DDP(TinyLM().to(device), device_ids=expert_setup.device_ids(device), gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    best = float("inf")
    for epoch in range(2):
        sampler.set_epoch(epoch)
        total = 0.0
        for step, (inputs, targets) in enumerate(loader):
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
            (loss_avg,) = expert_setup.mean_over_ranks(loss)
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss_avg:.6f}")
        if total < best:
            best = total
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "best.pt")
                print(f"epoch {epoch}: saved best.pt")
    if rank == 0:
        print("done")
    expert_setup.stop()


if __name__ == "__main__":
    main()
