"""A stand-in for a dataset library with `download=True` (torchvision-style), for the multi-node test.

"Downloading" writes the data file (atomically) and leaves a marker naming the process's
LOCAL_RANK, so a test can tell which ranks downloaded.
"""
import os

import torch
from torch.utils.data import TensorDataset


def Digits(root, download=False):
    path = os.path.join(root, "digits.pt")
    if download and not os.path.exists(path):
        os.makedirs(root, exist_ok=True)
        generator = torch.Generator().manual_seed(0)
        data = (torch.randn(128, 16, generator=generator), torch.randint(0, 4, (128,), generator=generator))
        torch.save(data, f"{path}.{os.getpid()}.part")
        os.replace(f"{path}.{os.getpid()}.part", path)
        marker = os.path.join(root, f"downloaded-by-local-rank-{os.environ.get('LOCAL_RANK', 'none')}-{os.getpid()}")
        os.close(os.open(marker, os.O_CREAT | os.O_WRONLY))
    x, y = torch.load(path)
    return TensorDataset(x, y)
