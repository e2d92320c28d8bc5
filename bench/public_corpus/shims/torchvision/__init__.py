"""A stand-in for torchvision in the public corpus (bench/public_corpus): the real package cannot be
installed beside this project's CPU torch build, and nothing here may download a data set.

datasets give a few hundred seeded random samples of the right shapes (PIL images, as torchvision's
do), transforms work on PIL images and tensors, utils.save_image writes a small PNG, and models has
the few architectures corpus scripts build (randomly initialised, never pretrained weights)."""

import sys

from . import datasets, models, transforms, utils  # noqa: F401

# `import torchvision.transforms.functional as TF` finds the namespace class as a module
sys.modules[f"{__name__}.transforms.functional"] = transforms.functional

__version__ = "0.0+ddpify-corpus-shim"
