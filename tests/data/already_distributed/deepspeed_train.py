import argparse

import deepspeed
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

parser = argparse.ArgumentParser()
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
engine, optimizer, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(), training_data=dataset)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device))
        engine.backward(loss)
        engine.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
