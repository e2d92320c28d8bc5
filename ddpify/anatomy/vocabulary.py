"""What ddpify knows about PyTorch and the libraries around it: each name set and test, once.

The analysis, the codemods and the lint rules all ask here, so `convert` and `lint` agree on what
a progress bar, a writer, an optimizer, a model-keeping method or a wrapper's own attribute is.
Names are qualified names as `ImportTable.qualname` spells them (`torch.nn.parallel.DataParallel`).
Facts about ranks, collectives and seeding live in `ddpify.anatomy.distributed`.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddpify.anatomy.tree import ScriptTree

# ----- wrappers ----------------------------------------------------------------------------------
DDP_WRAPPER = "torch.nn.parallel.DistributedDataParallel"
FORWARD = "forward"  # `model.forward(x)`: the module's (or its wrapper's) forward, as `model(x)` runs it
DP_WRAPPER = "torch.nn.parallel.DataParallel"
LEGACY_FSDP = "torch.distributed.fsdp.FullyShardedDataParallel"
# Modules that wrap a model and run its forward when called.
MODEL_WRAPPERS = frozenset({DDP_WRAPPER, DP_WRAPPER, LEGACY_FSDP})

# Everything an `nn.Module` answers itself (torch 2.x); a wrapper answers these too.
MODULE_ATTRIBUTES = frozenset({
    "T_destination", "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "compile",
    "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr", "float", "forward", "get_buffer",
    "get_extra_state", "get_parameter", "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia",
    "named_buffers", "named_children", "named_modules", "named_parameters", "parameters",
    "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter", "register_state_dict_post_hook",
    "register_state_dict_pre_hook", "requires_grad_", "set_extra_state", "set_submodule", "share_memory",
    "state_dict", "to", "to_empty", "train", "training", "type", "xpu", "zero_grad",
})
# What each wrapper answers itself besides what every nn.Module has (torch 2.x).
_OWN_ATTRIBUTES = {
    DDP_WRAPPER: frozenset({
        "broadcast_bucket_size", "broadcast_buffers", "bucket_bytes_cap", "device", "device_ids", "device_type",
        "dim", "find_unused_parameters", "gather", "gradient_as_bucket_view", "is_multi_device_module", "join",
        "join_device", "join_hook", "join_process_group", "logger", "mixed_precision", "module", "modules_buffers",
        "no_sync", "output_device", "parameters_to_ignore", "process_group", "reducer", "register_comm_hook",
        "require_backward_grad_sync", "require_forward_param_sync", "scatter", "static_graph", "to_kwargs",
        "will_sync_module_buffers",
    }),
    DP_WRAPPER: frozenset({
        "module", "device_ids", "output_device", "dim", "src_device_obj", "device_type", "replicate", "scatter",
        "parallel_apply", "gather",
    }),
}
WRAPPER_ATTRIBUTES = {wrapper: MODULE_ATTRIBUTES | own for wrapper, own in _OWN_ATTRIBUTES.items()}

# Read on a wrapper, these give what they give on the wrapped model: the rest of a converted
# script's reads of the model go through `.module` to keep their single-GPU meaning.
SAME_ON_WRAPPER = frozenset({
    "train", "eval", "parameters", "named_parameters", "zero_grad", "requires_grad_", "no_sync",
    "module", "training", "forward", "to", "cuda", "cpu",
})

# Loss functions of torch.nn.functional (they take `reduction=`); criterion classes are `torch.nn.*Loss`.
LOSS_FUNCTION = re.compile(r"^torch\.nn\.functional\.(\w+_loss|cross_entropy|binary_cross_entropy\w*|kl_div)$")


def is_loss_function(qualname: str) -> bool:
    return bool(LOSS_FUNCTION.match(qualname))


def is_criterion_class(qualname: str) -> bool:
    return qualname.startswith("torch.nn.") and qualname.endswith("Loss")


# torch's random draws (module functions): made in a forward, each rank draws its own numbers.
RANDOM_DRAWS = frozenset({
    "rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "normal", "bernoulli", "multinomial",
    "poisson", "randperm",
})
# The draws of indices among them: a batch picked at random offsets (`ix = torch.randint(len(data) - block, (bs,))`).
INDEX_DRAWS = frozenset({"randint", "randperm", "multinomial"})
# Tensor methods that fill a tensor in place from torch's global RNG (`noise.normal_(0, 1)`).
RANDOM_FILLS = frozenset({
    "normal_", "uniform_", "bernoulli_", "random_", "exponential_", "cauchy_", "log_normal_", "geometric_",
})

# Reads of a module's parameters: the methods that yield them, and the attributes layers keep them in.
PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})
STATE_DICT_METHODS = frozenset({"state_dict", "load_state_dict"})  # a model's (or optimizer's) state, out and in
PARAMETER_ATTRIBUTES = frozenset({"weight", "bias"})


TORCH_SAVE = "torch.save"
TORCH_LOAD = "torch.load"

# Calls whose first argument means the model itself: handed a wrapper, they would pickle it (it does
# not unpickle without a process group) or copy it (a second wrapper, its state_dict keys `module.`).
WHOLE_MODEL_CALLS = {
    TORCH_SAVE: "saves {} (the wrapper does not unpickle without a process group)",
    "copy.deepcopy": "copies {} (a copy of the wrapper is a second wrapper, its state_dict keys prefixed `module.`)",
}
# Calls that trace or summarize the model handed first by running its forward: the wrapper's forward
# reaches its process group, which torch.jit cannot trace ("Tried to trace ProcessGroup").
TRACES = "traces {} (the wrapper's forward reaches its process group, which cannot be traced)"
TRACING_CALLS = frozenset({"torch.jit.trace", "torch.jit.script", "torch.onnx.export", "torch.export.export",
                           "torchinfo.summary", "torchsummary.summary"})
TRACING_WRITER_METHODS = frozenset({"add_graph"})  # TensorBoard's `writer.add_graph(model, inputs)`
# Every call by name that must be handed the model inside a wrapper, with what it does to it.
INNER_MODEL_CALLS = {**WHOLE_MODEL_CALLS, **dict.fromkeys(TRACING_CALLS, TRACES)}


def wrapper_lacks(wrapper: str, attr: str) -> bool:
    """Does reading `attr` on this wrapper raise AttributeError (it lives on `.module`)?"""
    return not attr.startswith("_") and attr not in WRAPPER_ATTRIBUTES[wrapper]


def reads_through_module(attr: str) -> bool:
    """Does a converted script read `attr` of the wrapped model through `.module` (its own methods
    and attributes, and `state_dict()` whose keys the wrapper prefixes with `module.`)?"""
    return not attr.startswith("__") and attr not in SAME_ON_WRAPPER


# ----- models ------------------------------------------------------------------------------------
# nn.Module methods that return the module itself: `model.to(dev)` is still `model`.
MODULE_RETURNING_SELF = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "requires_grad_"})
DEVICE_MOVES = frozenset({"to", "cuda"})
# nn.Module methods that cast every parameter to another dtype (`.to(dtype)` too, a DEVICE_MOVES call with a dtype).
DTYPE_CASTS = frozenset({"float", "half", "double", "bfloat16", "type"})
NOT_MODELS = frozenset({"torch.nn.Parameter", "torch.nn.ParameterList", "torch.nn.ParameterDict", "torch.nn.Module"})
MODEL_CONTAINERS = frozenset({"torch.nn.ModuleList", "torch.nn.ModuleDict"})
BLOCK_SEQUENCES = frozenset({"torch.nn.ModuleList", "torch.nn.Sequential"})  # what FSDP shards block by block
PARAMETER_CONSTRUCTOR = "torch.nn.Parameter"
# Layers without parameters: one the forward never calls leaves no parameter without a gradient.
PARAMETER_FREE_LAYERS = re.compile(
    r"^torch\.nn\.(ReLU6?|LeakyReLU|R?ReLU|ELU|SELU|CELU|GELU|SiLU|Mish|Tanh|Sigmoid|Hardtanh|Hardsigmoid|Hardswish|Softplus"
    r"|Softsign|Softmax2?d?|LogSoftmax|Softmin|Threshold|Identity|Flatten|Unflatten|Upsample|Upsampling\w+|\w*Dropout\w*"
    r"|\w*Pool[123]d|PixelU?n?[Ss]huffle|\w+Pad[123]d|\w*Loss)$")
# nn.Module methods that reach every submodule without naming one (`for m in self.children(): x = m(x)`).
SUBMODULE_WALKS = frozenset({"children", "named_children", "modules", "named_modules", "_modules", "apply"})
MODEL_FACTORIES = ("torchvision.models.", "timm.create_model", "transformers.")
RECURRENT_LAYERS = frozenset({"torch.nn.RNN", "torch.nn.LSTM", "torch.nn.GRU"})  # hidden state: (layers, batch, hidden)
PAD_PACKED = "torch.nn.utils.rnn.pad_packed_sequence"  # pads to the longest sequence in its batch unless total_length=
BATCHNORM = re.compile(r"^torch\.nn\.(BatchNorm[123]d|LazyBatchNorm[123]d)$")


def is_builtin_layer(qualname: str) -> bool:
    """A `torch.nn` module class (`torch.nn.Linear`), not a loss, a parameter or `nn.Module` itself."""
    if not qualname.startswith("torch.nn.") or qualname.count(".") != 2 or qualname in NOT_MODELS:
        return False
    last = qualname.rsplit(".", 1)[1]
    return last[:1].isupper() and not last.endswith("Loss")


def is_model_factory(qualname: str) -> bool:
    """`torchvision.models.resnet18`, `timm.create_model`, `transformers.AutoModel.from_pretrained`."""
    return qualname.startswith(MODEL_FACTORIES) and (
        qualname.startswith("torchvision.models.") or "create_model" in qualname or qualname.endswith("from_pretrained")
    )


# ----- mixed precision (names as ddpify.anatomy.names canonicalizes them) ------------------------
AUTOCAST = "torch.autocast"  # also torch.cuda.amp.autocast and torch.amp.autocast
GRAD_SCALER = "torch.amp.GradScaler"  # also torch.cuda.amp.GradScaler
HALF_DTYPES = frozenset({"torch.float16", "torch.half"})  # autocast's dtype=: fp16, which needs loss scaling
BFLOAT16 = "torch.bfloat16"
FLOAT_DTYPES = HALF_DTYPES | {BFLOAT16, "torch.float32", "torch.float", "torch.float64", "torch.double"}
GRAD_SCALER_STEPS = frozenset({"step", "update", "unscale_"})  # what Accelerate's backward and optimizer do for it
CLIP_GRAD_NORM = "torch.nn.utils.clip_grad_norm_"  # Accelerate's clip_grad_norm_ unscales fp16 gradients first


# ----- optimizers --------------------------------------------------------------------------------
def is_optimizer_constructor(qualname: str) -> bool:
    """`torch.optim.SGD`, `torch.optim.AdamW` (not `torch.optim.lr_scheduler.StepLR`)."""
    return qualname.startswith("torch.optim.") and qualname.count(".") == 2


def is_scheduler_constructor(qualname: str) -> bool:
    return qualname.startswith("torch.optim.lr_scheduler.")


# ----- progress bars, logs and writers -----------------------------------------------------------
TQDM_CONSTRUCTORS = frozenset({"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm"})
# What a bar built with disable=True holds (its __init__ returns early): reading any other attribute
# (`bar.desc`, `bar.postfix`, `bar.start_t`) raises AttributeError.
DISABLED_BAR_ATTRIBUTES = frozenset({"iterable", "disable", "pos", "n", "total", "leave", "format_dict"})
# Calls that iterate their first argument: `for i, batch in enumerate(tqdm(loader))` iterates `loader`.
ITERATION_WRAPPERS = frozenset({"enumerate", "iter", "zip", "tqdm"}) | TQDM_CONSTRUCTORS
PRINT = "print"
BUILTIN_PRINT = "builtins.print"
TQDM_WRITE = "tqdm.write"  # a progress bar's print, as a class method (`tqdm.write(...)`) or on a bar
LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log"})
INFO_LOG_METHODS = frozenset({"debug", "info", "log"})  # below WARNING: progress that one rank can report
WANDB = "wandb."
WANDB_MEDIA = frozenset({"Table", "Image", "Histogram"})  # wandb.<these>(...) build values to log, not output
WANDB_INIT = "wandb.init"
# wandb.init(mode="disabled") starts a run that sends nothing, whose config, log, finish (and the module's
# wandb.config, wandb.log, wandb.run) still work: what the ranks other than 0 start.
WANDB_MODE = "mode"
WANDB_DISABLED = '"disabled"'
# A run's settings, which every rank reads: updating them (`wandb.config.update(...)`) is not output.
WANDB_CONFIG = ("wandb.config.", "wandb.run.config.")
# What a disabled run holds alike: the config given to init, the summary its log calls fill (its dir, name, id are its own).
WANDB_RUN_STATE = frozenset({"config", "summary"})
WRITER_CONSTRUCTORS = frozenset({"torch.utils.tensorboard.SummaryWriter", "tensorboardX.SummaryWriter", WANDB_INIT})

# ----- rank-0-only output ------------------------------------------------------------------------
# Calls that only format, read or measure. Inside output that runs on rank 0 alone (a print's f-string,
# a log's arguments) they leave nothing undone on the other ranks; any other call there may train,
# evaluate or join a collective (a project function, a library's), so it runs on every rank first.
PURE_FUNCTIONS = frozenset({
    "abs", "all", "any", "bool", "callable", "chr", "dict", "divmod", "float", "format", "frozenset", "getattr",
    "hasattr", "hash", "hex", "id", "int", "isinstance", "len", "list", "max", "min", "ord", "pow", "range", "repr",
    "reversed", "round", "set", "sorted", "str", "sum", "tuple", "type", "enumerate", "zip",
    "time.time", "time.perf_counter", "time.monotonic", "time.strftime", "time.localtime", "datetime.datetime.now",
    "os.path.join", "os.path.basename", "os.path.dirname", "os.path.exists", "os.path.abspath", "os.path.relpath",
    "os.path.splitext", "os.path.isfile", "os.path.isdir", "os.path.normpath", "os.getcwd", "os.getpid",
    "json.dumps", "socket.gethostname",
    "numpy.mean", "numpy.std", "numpy.sum", "numpy.median", "numpy.array", "numpy.asarray", "numpy.round",
    "torch.tensor", "torch.stack", "torch.cat", "torch.mean", "torch.sum", "torch.norm", "torch.numel", "torch.is_tensor",
    "torch.exp", "torch.log", "torch.sqrt", "torch.round", "torch.argmax", "torch.zeros", "torch.ones", "torch.full",
    "torch.arange", "torch.linspace", "torch.eye", "torch.zeros_like", "torch.ones_like",
    "torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.memory_allocated",
    "torch.cuda.max_memory_allocated", "torch.cuda.memory_reserved",
    "torch.distributed.get_rank", "torch.distributed.get_world_size", "torch.distributed.is_initialized",
})
PURE_MODULES = ("math.",)  # every function of these modules only computes
# Methods that read or format whatever holds them (a tensor, a string, a dict, a scheduler's rate).
PURE_METHODS = frozenset({
    "item", "tolist", "detach", "cpu", "numpy", "clone", "float", "double", "long", "mean", "sum", "max", "min",
    "std", "var", "argmax", "argmin", "abs", "norm", "numel", "size", "dim", "sqrt", "exp", "log", "squeeze",
    "view", "reshape", "flatten", "get_last_lr", "format", "join", "strip", "lower", "upper", "replace", "split",
    "startswith", "endswith", "ljust", "rjust", "zfill", "keys", "values", "items", "get", "count", "isoformat",
    "strftime", "total_seconds", "as_posix", "state_dict",
})


def is_pure_call(a: ScriptTree, call: ast.AST) -> bool:
    """Does `call` only format, read or measure (`len(x)`, `loss.item()`, `"{:.4f}".format(v)`,
    `math.exp(l)`, `time.time()`), so rank 0 may make it alone? A module's function counts only when
    named here: a method name alone says nothing about `requests.get(url)`."""
    if not isinstance(call, ast.Call):
        return False
    qualname = a.qualname(call.func) or ""
    if qualname in PURE_FUNCTIONS or qualname.startswith(PURE_MODULES):
        return True
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr in PURE_METHODS and not _names_a_module(a, func.value)


def _names_a_module(a: ScriptTree, expr: ast.AST) -> bool:
    """`np` in `np.get`, `os.path` in `os.path.get`: the name an import binds, not a value."""
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name) and expr.id in a.names.aliases


# ----- files -------------------------------------------------------------------------------------
SAVE_CALLS = frozenset({TORCH_SAVE, "numpy.save", "numpy.savez", "numpy.savetxt"})
# Calls that write a file named by an argument: a rank-0 duty under DDP, like `open(path, "w")`.
FILE_WRITE_CALLS = SAVE_CALLS | frozenset({
    "numpy.savez_compressed", "pickle.dump", "torchvision.utils.save_image", "matplotlib.pyplot.savefig",
    "shutil.copyfile", "shutil.copy", "shutil.copy2",
})
# Methods that write a file whatever they are called on (a figure, a DataFrame, a Hugging Face model).
FILE_WRITE_METHODS = frozenset({"savefig", "to_csv", "to_parquet", "save_pretrained"})
# Calls that remove or move a file named by an argument: run by every rank at once, all but the first
# find it gone (FileNotFoundError); a rank-0 duty like a write. `path.unlink()` is pathlib's.
FILE_REMOVE_CALLS = frozenset({"os.remove", "os.unlink", "os.rmdir", "os.rename", "os.replace", "shutil.rmtree",
                               "shutil.move"})
FILE_REMOVE_METHODS = frozenset({"unlink", "rmdir"})
# Calls that create a directory: run by every rank at once, all but the first fail unless exist_ok=True.
DIRECTORY_CREATORS = frozenset({"os.makedirs", "os.mkdir"})
ITERABLE_DATASETS = frozenset({"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"})
OPEN_CALLS = frozenset({"open", "io.open"})
_WRITE_MODES = frozenset("wax+")


def opens_for_writing(a: ScriptTree, call: ast.AST) -> bool:
    """`open(path, "w")` (or "a", "x", "+")."""
    if not (isinstance(call, ast.Call) and a.qualname(call.func) in OPEN_CALLS):
        return False
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(_WRITE_MODES & set(mode.value))

# Libraries that launch and distribute training themselves: scripts built on them are left alone.
ACCELERATOR = "accelerate.Accelerator"
DDP_KWARGS = "accelerate.DistributedDataParallelKwargs"  # the DDP wrap's options, for Accelerator(kwargs_handlers=...)
LOADER_CONFIG = "accelerate.DataLoaderConfiguration"  # how prepared loaders shuffle and batch, for Accelerator(dataloader_config=...)
# What an Accelerator offers in place of torch.distributed's spellings (its attribute and method names).
ACCELERATOR_RANK_VALUES = frozenset({"process_index", "local_process_index"})  # `accelerator.process_index == 0`
ACCELERATOR_COLLECTIVES = frozenset({"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes"})
ACCELERATOR_OUTPUT = frozenset({"print", "save", "save_model", "save_state"})  # made on the main process only, called by every one
ACCELERATOR_PREPARE = "prepare"  # wraps each model (DDP on several processes), shards each loader
ACCELERATOR_UNWRAP = "unwrap_model"  # the prepared model's `.module`
ACCELERATOR_SYNC_SKIPS = frozenset({"no_sync", "accumulate"})  # the wrapper's no_sync()
# Accelerator(...) options under which prepare wraps a model in something else than DDP (FSDP, DeepSpeed, Megatron, ND parallelism).
ACCELERATOR_OTHER_WRAPS = frozenset({"fsdp_plugin", "deepspeed_plugin", "deepspeed_plugins", "megatron_lm_plugin", "parallelism_config"})
DISTRIBUTING_FRAMEWORKS = {
    ACCELERATOR: "Accelerate",
    "lightning.Trainer": "Lightning", "lightning.pytorch.Trainer": "Lightning", "pytorch_lightning.Trainer": "Lightning",
    "lightning.Fabric": "Lightning Fabric", "lightning.fabric.Fabric": "Lightning Fabric",
    "transformers.Trainer": "the Hugging Face Trainer", "transformers.Seq2SeqTrainer": "the Hugging Face Trainer",
    "trl.SFTTrainer": "the Hugging Face Trainer",
    "deepspeed.initialize": "DeepSpeed",
}

# Optimizers that scale each step by running gradient statistics: a larger batch calls for about
# sqrt(k) times their learning rate, where SGD's linear scaling rule asks for k times.
ADAPTIVE_OPTIMIZERS = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "SparseAdam"})
