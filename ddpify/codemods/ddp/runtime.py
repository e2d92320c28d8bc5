"""The code a DDP conversion adds to a script, and the names it introduces."""

RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
RANK_DEVICE = "RANK_DEVICE"
IS_RANK_ZERO = "RANK == 0"

HELPERS = '''
# ddpify: distributed setup. torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; under plain
# `python` the script runs as a single process (world size 1).
RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))

# "cuda" without an index means this process's GPU once setup_distributed() has run.
RANK_DEVICE = torch.device("cuda", LOCAL_RANK) if torch.cuda.is_available() else torch.device("cpu")


def setup_distributed():
    """Join the process group: NCCL on GPUs, gloo on CPU."""
    if dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(LOCAL_RANK)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend)
    else:  # plain `python`: a one-process group needs no rendezvous
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)


def cleanup_distributed():
    """Leave the process group."""
    if dist.is_initialized():
        dist.destroy_process_group()
'''

SETUP_CALL = "setup_distributed()\n"
CLEANUP_CALL = "cleanup_distributed()\n"
