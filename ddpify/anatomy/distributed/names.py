"""The torch.distributed vocabulary the DDP and FSDP questions read: collectives, FSDP entry points, samplers,
seeding, spawning and per-node downloads, each a qualified name or a set of them.
"""

from __future__ import annotations

from ddpify.anatomy.vocabulary import LEGACY_FSDP, OPEN_CALLS, RANDOM_FILLS

DIST = "torch.distributed"
COLLECTIVES = frozenset(
    f"{DIST}.{name}"
    for name in (
        "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_gather_coalesced",
        "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier",
        "broadcast", "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor",
        "gather", "gather_object", "scatter", "scatter_object_list", "new_group",
    )
) | frozenset({  # distributed checkpoints (DCP): every rank writes, or reads, its own shards together
    f"{DIST}.checkpoint.save", f"{DIST}.checkpoint.load",
    f"{DIST}.checkpoint.state_dict_saver.save", f"{DIST}.checkpoint.state_dict_loader.load",
})
DCP_MODULE = f"{DIST}.checkpoint"
# FSDP2's per-module sharding (public since torch 2.6; `_composable` before), and legacy FSDP.
FULLY_SHARD = frozenset({f"{DIST}.fsdp.fully_shard", f"{DIST}._composable.fsdp.fully_shard"})
# Legacy FSDP's state-dict modes whose `state_dict()` holds this rank's shards only (entered with
# `FSDP.state_dict_type(model, StateDictType.<mode>)` or set with `FSDP.set_state_dict_type`).
LEGACY_STATE_DICT_MODES = frozenset({f"{LEGACY_FSDP}.state_dict_type", f"{LEGACY_FSDP}.set_state_dict_type"})
SHARDED_STATE_DICT_TYPES = frozenset({"SHARDED_STATE_DICT", "LOCAL_STATE_DICT"})
LEGACY_SUMMON = f"{LEGACY_FSDP}.summon_full_params"
# FSDP2's mixed precision: the dtype of the unsharded parameters (forward/backward) and of the gradient reduction.
MIXED_PRECISION_POLICY = f"{DIST}.fsdp.MixedPrecisionPolicy"
# Whole-state gathers of a sharded model: collectives, whatever rank writes the result.
STATE_DICT_GATHERS = frozenset(
    f"{DIST}.checkpoint.state_dict.{name}" for name in ("get_model_state_dict", "get_optimizer_state_dict", "get_state_dict")
)
# Per-node duties: downloads and extractions into a node's disk, done by local rank 0 of each node.
DOWNLOADERS = frozenset({
    "torchvision.datasets.utils.download_url", "torchvision.datasets.utils.download_and_extract_archive",
    "torch.hub.download_url_to_file", "huggingface_hub.snapshot_download", "huggingface_hub.hf_hub_download",
    "datasets.load_dataset", "urllib.request.urlretrieve", "shutil.unpack_archive",
})
# An archive's extraction onto disk (`tarfile`/`zipfile` objects), and URL reads that are a download
# when the statement around them writes a file (`open(path, "wb")`) or extracts an archive.
EXTRACTIONS = frozenset({"extractall"})
URL_READS = frozenset({"requests.get", "urllib.request.urlopen"})
WRITE_MODES = frozenset("wax")
# The `with` items that stream a download (its body finishes it): a URL read or an archive, with the
# files it writes; and the tests that skip a download done already.
ARCHIVE_OPENERS = frozenset({"tarfile.open", "zipfile.ZipFile"})
TRANSFER_OPENERS = URL_READS | ARCHIVE_OPENERS | OPEN_CALLS
EXISTENCE_CHECKS = frozenset({"os.path.exists", "os.path.isfile", "os.path.isdir"})
PATH_EXISTENCE_METHODS = frozenset({"exists", "is_file", "is_dir"})
DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
SYNC_BATCHNORM_CONVERT = "torch.nn.SyncBatchNorm.convert_sync_batchnorm"
SPAWN_CALLS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})
# The launcher's environment variables that hold a rank, and the calls that read one with a default.
RANK_VARIABLES = ("RANK", "LOCAL_RANK")
ENVIRONMENT_READS = frozenset({"os.environ.get", "os.getenv"})
RANDOM_SPLIT = "torch.utils.data.random_split"
# ----- seeding: the global RNGs, their seeds, their draws -------------------------------------
TORCH, NUMPY, PYTHON = "torch", "numpy", "random"
EVERY_RNG = frozenset({TORCH, NUMPY, PYTHON})
RNG_SEEDERS = {
    "torch.manual_seed": TORCH, "torch.random.manual_seed": TORCH, "numpy.random.seed": NUMPY, "random.seed": PYTHON,
}
SEED_EVERYTHING = frozenset({
    "lightning.seed_everything", "pytorch_lightning.seed_everything", "lightning.pytorch.seed_everything",
    "transformers.set_seed", "accelerate.utils.set_seed",
})
# numpy.random's names that build or seed a generator instead of drawing from the global one.
NUMPY_RANDOM = "numpy.random."
NUMPY_NON_DRAWS = frozenset({
    "seed", "default_rng", "RandomState", "Generator", "SeedSequence", "get_state", "set_state", "BitGenerator",
    "PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64",
})
PYTHON_DRAWS = frozenset(f"random.{name}" for name in (
    "random", "randint", "randrange", "choice", "choices", "shuffle", "sample", "uniform", "gauss", "normalvariate",
    "betavariate", "expovariate", "triangular", "getrandbits", "lognormvariate", "gammavariate",
))
# Shuffles whose result, cut in two, splits a data set: the RNG each draws from.
INDEX_SHUFFLES = {"random.shuffle": PYTHON, "numpy.random.shuffle": NUMPY, "numpy.random.permutation": NUMPY, "torch.randperm": TORCH}
TRAIN_TEST_SPLIT = "sklearn.model_selection.train_test_split"  # numpy's global RNG unless random_state=
WEIGHT_INIT = "torch.nn.init."
RESETS = frozenset({"reset_parameters", "init_weights"}) | RANDOM_FILLS
# What a script sets when it cares that runs repeat: cudnn's deterministic switch, torch's.
DETERMINISTIC_FLAG = "torch.backends.cudnn.deterministic"
DETERMINISTIC_ALGORITHMS = "torch.use_deterministic_algorithms"
SEED_OPTION = "seed"  # `--seed`, `args.seed`, `config.seed`: a documented switch
SYNC_MODULE_STATES = "sync_module_states"  # legacy FSDP's broadcast of rank 0's weights
SEED_CALLS = frozenset(q for q, rng in RNG_SEEDERS.items() if rng == TORCH) | SEED_EVERYTHING  # what seeds torch
