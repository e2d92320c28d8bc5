"""torchvision.transforms for the corpus shim: on PIL images and on tensors (C, H, W)."""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


def _size(size):
    return (size, size) if isinstance(size, int) else tuple(size)


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, pic):
        if isinstance(pic, torch.Tensor):
            return pic.float() / 255 if pic.dtype == torch.uint8 else pic
        array = np.array(pic, dtype=np.uint8, copy=True)
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array).permute(2, 0, 1).float().div(255)


class PILToTensor:
    def __call__(self, pic):
        array = np.array(pic, dtype=np.uint8, copy=True)
        return torch.from_numpy(array if array.ndim == 3 else array[:, :, None]).permute(2, 0, 1)


class ToPILImage:
    def __init__(self, mode=None):
        self.mode = mode

    def __call__(self, x):
        if isinstance(x, Image.Image):
            return x
        array = (x.float().clamp(0, 1) * 255).byte().permute(1, 2, 0).numpy() if x.dtype != torch.uint8 else x.permute(1, 2, 0).numpy()
        return Image.fromarray(array[:, :, 0]) if array.shape[2] == 1 else Image.fromarray(array)


class Normalize:
    def __init__(self, mean, std, inplace=False):
        self.mean, self.std = mean, std

    def __call__(self, x):
        mean = torch.as_tensor(self.mean, dtype=x.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=x.dtype).view(-1, 1, 1)
        return (x - mean) / std


class Lambda:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, x):
        return self.fn(x)


class Resize:
    def __init__(self, size, interpolation=None, max_size=None, antialias=True):
        self.size = size

    def __call__(self, x):
        if isinstance(x, Image.Image):
            if isinstance(self.size, int):
                w, h = x.size
                short = min(w, h)
                target = (round(w * self.size / short), round(h * self.size / short))
            else:
                target = (self.size[1], self.size[0])
            return x.resize(target, Image.BILINEAR)
        if isinstance(self.size, int):
            h, w = x.shape[-2:]
            short = min(h, w)
            target = (round(h * self.size / short), round(w * self.size / short))
        else:
            target = tuple(self.size)
        return F.interpolate(x.unsqueeze(0).float(), size=target, mode="bilinear", align_corners=False).squeeze(0)


Scale = Resize


def _crop(x, top, left, h, w):
    if isinstance(x, Image.Image):
        return x.crop((left, top, left + w, top + h))
    return x[..., top:top + h, left:left + w]


def _hw(x):
    return (x.size[1], x.size[0]) if isinstance(x, Image.Image) else tuple(x.shape[-2:])


class CenterCrop:
    def __init__(self, size):
        self.size = _size(size)

    def __call__(self, x):
        h, w = _hw(x)
        th, tw = self.size
        return _crop(x, max((h - th) // 2, 0), max((w - tw) // 2, 0), th, tw)


class Pad:
    def __init__(self, padding, fill=0, padding_mode="constant"):
        self.padding = padding

    def __call__(self, x):
        p = self.padding
        if isinstance(x, Image.Image):
            array = np.array(x)
            pads = ((p, p), (p, p)) + (((0, 0),) if array.ndim == 3 else ())
            return Image.fromarray(np.pad(array, pads))
        return F.pad(x, (p, p, p, p))


class RandomCrop:
    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        self.size, self.padding = _size(size), padding

    def __call__(self, x):
        if self.padding:
            x = Pad(self.padding)(x)
        h, w = _hw(x)
        th, tw = self.size
        return _crop(x, random.randint(0, max(h - th, 0)), random.randint(0, max(w - tw, 0)), th, tw)


class RandomResizedCrop:
    def __init__(self, size, scale=(0.08, 1.0), ratio=(0.75, 1.333), interpolation=None, antialias=True):
        self.size = _size(size)

    def __call__(self, x):
        return Resize(self.size)(x)


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, x):
        if random.random() >= self.p:
            return x
        return x.transpose(Image.FLIP_LEFT_RIGHT) if isinstance(x, Image.Image) else x.flip(-1)


class RandomVerticalFlip(RandomHorizontalFlip):
    def __call__(self, x):
        if random.random() >= self.p:
            return x
        return x.transpose(Image.FLIP_TOP_BOTTOM) if isinstance(x, Image.Image) else x.flip(-2)


class RandomRotation:
    def __init__(self, degrees, *args, **kwargs):
        pass

    def __call__(self, x):
        return x


class ColorJitter(RandomRotation):
    def __init__(self, *args, **kwargs):
        pass


class Grayscale:
    def __init__(self, num_output_channels=1):
        self.n = num_output_channels

    def __call__(self, x):
        if isinstance(x, Image.Image):
            g = x.convert("L")
            return g if self.n == 1 else g.convert("RGB")
        g = x.mean(0, keepdim=True)
        return g.expand(self.n, *g.shape[1:]).clone()


class InterpolationMode:
    NEAREST, BILINEAR, BICUBIC = "nearest", "bilinear", "bicubic"


class functional:  # noqa: N801 - a namespace, as torchvision.transforms.functional
    to_tensor = staticmethod(lambda pic: ToTensor()(pic))
    normalize = staticmethod(lambda x, mean, std: Normalize(mean, std)(x))
    resize = staticmethod(lambda x, size, *a, **k: Resize(size)(x))
