"""Expert FSDP2 port of fixtures/fsdp/tiny_transformer.py: fully_shard on every block, then on the
root; rank 0's decision to checkpoint broadcast to all ranks (the full state dict is gathered by
every rank), rank 0's own step loss printed, as the conversion prints it."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard
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

    model = TinyLM().to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
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
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
        improved = [total < best]
        dist.broadcast_object_list(improved, src=0)
        if improved[0]:
            best = total
            state = {"model": get_model_state_dict(model, options=full),
                     "optimizer": get_optimizer_state_dict(model, optimizer, options=full)}
            if rank == 0:
                torch.save(state, "best.pt")
                print(f"epoch {epoch}: saved best.pt")
    if rank == 0:
        print("done")
    expert_setup.stop()


if __name__ == "__main__":
    main()
