"""Seeded made-up data sets with torchvision's constructors and attributes (DDPIFY_CORPUS_SAMPLES samples)."""

from __future__ import annotations

import os

import numpy as np
import torch
from PIL import Image


def _count(train: bool) -> int:
    n = int(os.environ.get("DDPIFY_CORPUS_SAMPLES", "256"))
    return n if train else max(n // 2, 1)


class VisionDataset(torch.utils.data.Dataset):
    def __init__(self, root=None, transform=None, target_transform=None, transforms=None):
        self.root, self.transform, self.target_transform = root, transform, target_transform

    def _finish(self, image, target):
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class MNIST(VisionDataset):
    classes = [f"{i} - digit" for i in range(10)]
    size = (28, 28)

    def __init__(self, root=None, train=True, transform=None, target_transform=None, download=False, **_):
        super().__init__(root, transform, target_transform)
        self.train = train
        rng = np.random.default_rng(1 if train else 2)
        n = _count(train)
        self.data = torch.from_numpy(rng.integers(0, 256, (n, *self.size), dtype=np.uint8))
        self.targets = torch.from_numpy(rng.integers(0, len(self.classes), n)).long()

    # the pre-0.4 names
    train_data = property(lambda self: self.data)
    test_data = property(lambda self: self.data)
    train_labels = property(lambda self: self.targets)
    test_labels = property(lambda self: self.targets)
    class_to_idx = property(lambda self: {c: i for i, c in enumerate(self.classes)})

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self._finish(Image.fromarray(self.data[index].numpy(), mode="L"), int(self.targets[index]))


class FashionMNIST(MNIST):
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


class KMNIST(MNIST):
    pass


class EMNIST(MNIST):
    def __init__(self, root=None, split="balanced", **kwargs):
        super().__init__(root, **kwargs)


class CIFAR10(VisionDataset):
    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

    def __init__(self, root=None, train=True, transform=None, target_transform=None, download=False, **_):
        super().__init__(root, transform, target_transform)
        self.train = train
        rng = np.random.default_rng(3 if train else 4)
        n = _count(train)
        self.data = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        self.targets = [int(t) for t in rng.integers(0, len(self.classes), n)]

    class_to_idx = property(lambda self: {c: i for i, c in enumerate(self.classes)})

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self._finish(Image.fromarray(self.data[index]), self.targets[index])


class CIFAR100(CIFAR10):
    classes = [f"class{i}" for i in range(100)]


class SVHN(CIFAR10):
    def __init__(self, root=None, split="train", transform=None, target_transform=None, download=False):
        super().__init__(root, split == "train", transform, target_transform)


class FakeData(VisionDataset):
    def __init__(self, size=None, image_size=(3, 224, 224), num_classes=10, transform=None, target_transform=None, random_offset=0):
        super().__init__(None, transform, target_transform)
        self.size = size if size is not None and size <= _count(True) else _count(True)
        self.image_size, self.num_classes, self.random_offset = tuple(image_size), num_classes, random_offset

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index + self.random_offset)
        image = (torch.rand(self.image_size, generator=g) * 255).to(torch.uint8)
        target = int(torch.randint(0, self.num_classes, (1,), generator=g))
        array = image.permute(1, 2, 0).numpy()
        pil = Image.fromarray(array[:, :, 0], mode="L") if array.shape[2] == 1 else Image.fromarray(array)
        return self._finish(pil, target)


class ImageFolder(FakeData):
    """Made-up RGB images in 4 classes (the folder is not read)."""

    def __init__(self, root=None, transform=None, target_transform=None, loader=None, is_valid_file=None, **_):
        super().__init__(None, (3, 64, 64), 4, transform, target_transform)
        self.root = root
        self.classes = [f"class{i}" for i in range(4)]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(f"{root}/{i}.png", int(self[i][1]) if transform is None else 0) for i in range(0)]
        self.targets = [s[1] for s in self.samples]


class LSUN(ImageFolder):
    pass
