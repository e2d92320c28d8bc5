"""ddpify: turn single-GPU PyTorch training scripts into multi-GPU ones, and lint them."""

__version__ = "0.1.0"
