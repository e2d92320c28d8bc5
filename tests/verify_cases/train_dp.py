"""Correct hand-written DataParallel port of train.py: custom methods go through `.module`."""
import torch
from torch import nn
from torch.utils.data import DataLoader

from toy import TinyMLP, make_dataset, parse_args


def main():
    args = parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)
    model = nn.DataParallel(TinyMLP(batchnorm=args.batchnorm).to(device))
    print(model.module.describe())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss(reduction=args.reduction)
    for epoch in range(args.epochs):
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
