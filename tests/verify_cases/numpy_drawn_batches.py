"""Batches picked from one whole tensor by rows that numpy draws, unseeded (skip-gram and toy-regression tutorials)."""

import numpy as np
import torch
from torch import nn

x = torch.linspace(-1, 1, 64).unsqueeze(1)
y = x**2 + 0.1 * torch.cos(5 * x)
model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
loss_fn = nn.MSELoss()
for step in range(6):
    rows = torch.from_numpy(np.random.choice(64, 8, replace=False))
    optimizer.zero_grad()
    loss = loss_fn(model(x[rows]), y[rows])
    loss.backward()
    optimizer.step()
