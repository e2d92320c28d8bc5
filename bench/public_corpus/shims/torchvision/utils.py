"""torchvision.utils for the corpus shim: make_grid tiles, save_image writes a small PNG."""

import torch
from PIL import Image


def make_grid(tensor, nrow=8, padding=2, normalize=False, value_range=None, scale_each=False, pad_value=0.0, **_):
    if isinstance(tensor, (list, tuple)):
        tensor = torch.stack(list(tensor))
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() == 3:
        tensor = tensor.unsqueeze(0)
    if tensor.size(1) == 1:
        tensor = tensor.repeat(1, 3, 1, 1)
    if normalize:
        tensor = tensor.clone()
        low, high = value_range or (float(tensor.min()), float(tensor.max()))
        tensor = (tensor - low) / max(high - low, 1e-5)
    n, c, h, w = tensor.shape
    cols = min(nrow, n)
    rows = (n + cols - 1) // cols
    grid = torch.full((c, rows * (h + padding) + padding, cols * (w + padding) + padding), float(pad_value))
    for i in range(n):
        r, k = divmod(i, cols)
        grid[:, r * (h + padding) + padding:r * (h + padding) + padding + h,
             k * (w + padding) + padding:k * (w + padding) + padding + w] = tensor[i]
    return grid


def save_image(tensor, fp, nrow=8, padding=2, format=None, **kwargs):
    grid = make_grid(tensor.detach().cpu().float(), nrow=nrow, padding=padding, **kwargs)
    array = grid.clamp(0, 1).mul(255).byte().permute(1, 2, 0).numpy()
    Image.fromarray(array).save(fp, format=format or "PNG")
