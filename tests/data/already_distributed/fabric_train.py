import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

fabric = L.Fabric(accelerator="cuda", devices=2, strategy="ddp")
fabric.launch()
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = fabric.setup(model, optimizer)
loader = fabric.setup_dataloaders(DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8, shuffle=True))
for epoch in range(2):
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
