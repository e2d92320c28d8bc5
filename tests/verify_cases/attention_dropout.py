"""A Transformer encoder with attention and feed-forward dropout, trained with Adam."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(64, 6, 16)
    y = torch.randint(0, 3, (64,))
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, dropout=0.2, batch_first=True), 2)
    model = nn.Sequential(encoder, nn.Flatten(), nn.Linear(6 * 16, 3)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for step, (xb, yb) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(xb.to(device)), yb.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
