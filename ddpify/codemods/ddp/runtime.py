"""The code a DDP conversion adds to a script, and the names it introduces."""

RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
RANK_DEVICE = "RANK_DEVICE"
IS_RANK_ZERO = "RANK == 0"
RUNTIME_NAMES = (RANK, LOCAL_RANK, WORLD_SIZE, RANK_DEVICE)

RANK_CONSTANTS = '''
# ddpify: distributed setup. torchrun sets RANK, LOCAL_RANK and WORLD_SIZE;
# under plain `python` the script runs as a single process (world size 1).
RANK = int(os.environ.get("RANK", 0))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))

# This process's GPU, or the CPU. (Once setup_distributed() has run, "cuda"
# without an index means this GPU too.)
if torch.cuda.is_available():
    RANK_DEVICE = torch.device("cuda", LOCAL_RANK)
else:
    RANK_DEVICE = torch.device("cpu")
'''

SETUP_HELPER = RANK_CONSTANTS + '''

def setup_distributed():
    """Join the process group: NCCL on GPUs, gloo on CPU."""
    if dist.is_initialized():
        return
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        if LOCAL_RANK >= gpus:  # more processes than GPUs on this machine
            why = f"rank {RANK}: LOCAL_RANK {LOCAL_RANK} but {gpus} GPU(s)"
            raise SystemExit(f"{why}: use torchrun --nproc_per_node={gpus}")
        torch.cuda.set_device(LOCAL_RANK)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend)
    else:  # plain `python`: a one-process group needs no rendezvous
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1)

'''
# DDP's teardown releases the wrappers' gradient all-reduces first: they hold Python state,
# and released at interpreter exit, gloo can abort the rank ('terminate called without an
# active exception'). A sharded model has no DDP wrapper to release.
DDP_CLEANUP = '''

def cleanup_distributed():
    """Leave the process group, once DDP's wrappers are released."""
    ddp = torch.nn.parallel.DistributedDataParallel
    for wrapper in gc.get_objects():  # held, or garbage in reference cycles
        if issubclass(type(wrapper), ddp):  # its logger holds its reducer
            wrapper.reducer = wrapper.logger = None
    gc.collect()  # the cycles, while Python still runs
    if dist.is_initialized():
        dist.destroy_process_group()
'''
SHARDED_CLEANUP = '''

def cleanup_distributed():
    """Leave the process group."""
    if dist.is_initialized():
        dist.destroy_process_group()
'''

HELPERS = SETUP_HELPER + DDP_CLEANUP  # the DDP target's, as one text
SETUP_CALL = "setup_distributed()\n"
CLEANUP_CALL = "cleanup_distributed()\n"
RELEASE_COMMENT = "# ddpify: drop the wrappers first, so cleanup_distributed() releases them\n# before Python exits.\n"

SHARD_HELPER = '''

def evaluation_shard(size, batch_size):
    """This rank's contiguous run of whole evaluation batches, never padded."""
    batches = -(-size // batch_size)
    first = RANK * batches // WORLD_SIZE
    last = (RANK + 1) * batches // WORLD_SIZE
    return range(first * batch_size, min(last * batch_size, size))
'''

SUMS_HELPER = '''

def all_reduce_sums(*values):
    """Numbers and tensors summed over the ranks (ints stay ints)."""
    numbers = [float(v) for v in values if not torch.is_tensor(v)]
    totals = torch.tensor(numbers, dtype=torch.float64, device=RANK_DEVICE)
    if numbers:
        dist.all_reduce(totals)
    totals = iter(totals.tolist())
    return [_summed(v, totals) for v in values]


def _summed(value, totals):
    """A tensor summed over the ranks, or a number's total from `totals`."""
    if not torch.is_tensor(value):
        return type(value)(next(totals))
    total = value.detach().to(RANK_DEVICE, copy=True)
    dist.all_reduce(total)
    return total.to(value.device)
'''

GATHER_HELPER = '''

def all_gather_lists(items):
    """Every rank's list joined in rank order: the single-process list."""
    parts = [None] * WORLD_SIZE
    dist.all_gather_object(parts, items)
    joined = [x for part in parts for x in part]
    cuda = [torch.is_tensor(x) and x.is_cuda for x in joined]
    return [x.to(RANK_DEVICE) if c else x for x, c in zip(joined, cuda)]
'''

MEAN_HELPER = '''

def mean_over_ranks(*values):
    """Each value's mean over the ranks, in one all_reduce."""
    # the training losses of the whole global batch: one value, or a tuple
    parts = [_flattened(value) for value in values]
    totals = torch.cat(parts)  # in the widest of their types
    dist.all_reduce(totals)
    means = (totals / WORLD_SIZE).split([part.numel() for part in parts])
    means = [_shaped_like(value, mean) for value, mean in zip(values, means)]
    return means[0] if len(means) == 1 else tuple(means)


def _flattened(value):
    """A tensor or a number as a flat tensor on this rank's device."""
    if torch.is_tensor(value):
        return value.detach().to(RANK_DEVICE).reshape(-1)
    number = torch.tensor([float(value)], dtype=torch.float64)
    return number.to(RANK_DEVICE)


def _shaped_like(value, mean):
    """A mean as its value was: a float, or a tensor like it."""
    if not torch.is_tensor(value):
        return mean.item()
    dtype = value.dtype if value.is_floating_point() else mean.dtype
    return mean.view(value.shape).to(value.device, dtype)
'''

MODULE_HELPER = '''

def evaluation_module(model):
    """The model inside its DDP wrapper, with rank 0's buffers (BatchNorm statistics).

    Ranks evaluate unequal numbers of batches, and the wrapper's forward may
    broadcast buffers, a collective every rank must join: evaluation calls the
    module itself.
    """
    wrapper = getattr(model, "_orig_mod", model)  # under torch.compile
    if not isinstance(wrapper, torch.nn.parallel.DistributedDataParallel):
        return model
    for buffer in wrapper.module.buffers():
        dist.broadcast(buffer, src=0)
    return wrapper.module
'''

PLAIN_HELPER = '''

def plain_model(model):
    """The model inside its DDP wrapper, or `model` itself where it is not
    wrapped (a model loaded from a checkpoint after training)."""
    wrapper = getattr(model, "_orig_mod", model)  # under torch.compile
    if isinstance(wrapper, torch.nn.parallel.DistributedDataParallel):
        return wrapper.module
    return model
'''

ROWS_HELPER = '''

def loss_of_rank_rows(loss_fn, *batch, rows=None, **options):
    """loss_fn's mean (or sum) over this rank's rows of a whole batch (every WORLD_SIZE-th).

    Weighted by its share of the rows (a sum by WORLD_SIZE), so DDP's average of
    the ranks' gradients is the whole batch's gradient; its value is the whole
    batch's loss, alike on every rank. Arguments whose rows don't pair up: the
    whole loss everywhere. A loss written by hand, torch.mean or torch.sum of
    one tensor, is shared by that tensor's rows. Given `rows` (the batch's),
    the arguments are this rank's rows already (its forward ran on them only).
    """
    if rows is None:
        sizes = {len(t) if torch.is_tensor(t) and t.dim() else 0 for t in batch}
        rows = sizes.pop() if len(sizes) == 1 else 0
        batch = [rows_of_rank(t) for t in batch] if rows >= WORLD_SIZE else batch
    if rows < WORLD_SIZE:
        return loss_fn(*batch, **options)
    reduction = options.get("reduction", getattr(loss_fn, "reduction", "mean"))
    sums = reduction == "sum" or options.get("size_average") is False or loss_fn is torch.sum
    share = loss_fn(*batch, **options) * (WORLD_SIZE if sums else len(batch[0]) * WORLD_SIZE / rows)
    whole = share.detach().clone()
    dist.all_reduce(whole)
    return share + (whole / WORLD_SIZE - share.detach())


def rows_of_rank(batch):
    """This rank's rows of a batch (every WORLD_SIZE-th), if it has enough."""
    if torch.is_tensor(batch) and batch.dim() and len(batch) >= WORLD_SIZE:
        return batch[RANK::WORLD_SIZE]
    return batch
'''

AGREE_HELPER = '''

def on_every_rank(flag):
    """True on every rank where `flag` is true on every rank (one all_reduce):
    the ranks take a branch or leave a loop together, so each makes the same
    optimizer steps (DDP's all_reduce would wait forever otherwise)."""
    agreed = torch.tensor(1.0 if flag else 0.0, device=RANK_DEVICE)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return bool(agreed.item())


def on_any_rank(flag):
    """True on every rank where `flag` is true on any rank (see on_every_rank)."""
    return not on_every_rank(not flag)
'''

AVERAGE_HELPER = '''

def broadcast_parameters(optimizer):
    """Rank 0's values of the parameters `optimizer` trains, on every rank: the
    ranks start alike, and averaged gradients keep them alike. (Through this
    rank's device: NCCL takes no CPU tensor.)"""
    for group in optimizer.param_groups:
        for param in group["params"]:
            value = param.data.to(RANK_DEVICE)
            dist.broadcast(value, src=0)
            param.data.copy_(value)


def average_gradients(optimizer):
    """The gradients of the parameters `optimizer` trains, averaged over the ranks
    in one all_reduce: what a DDP wrapper does, done by hand for an optimizer its
    model builds and steps itself. A gradient a rank lacks counts as zero there;
    a parameter no rank has a gradient for keeps none."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
    had = [float(p.grad is not None) for p in params]
    flat = torch.cat([grads[0].new_tensor(had), *(g.reshape(-1) for g in grads)]).to(RANK_DEVICE)
    dist.all_reduce(flat)
    offset = len(params)
    for param, grad, ranks_with_grad in zip(params, grads, flat[:offset].tolist()):
        if ranks_with_grad:
            summed = flat[offset:offset + grad.numel()].view_as(grad)
            param.grad = grad.copy_(summed / WORLD_SIZE)
        offset += grad.numel()
'''

MODEL_ROWS_HELPER = '''

def model_loss_of_rank_rows(model, *batch, loss_at=None, targets=1, ignored=None):
    """The loss `model` returns (item `loss_at` of its result) for this rank's
    rows of a whole batch (every WORLD_SIZE-th).

    Weighted by its share of the rows (of the targets not `ignored`), so DDP's
    average of the ranks' gradients is the whole batch's gradient; its value is
    the whole batch's loss, alike on every rank. The model's other outputs hold
    this rank's rows only. Arguments whose rows don't pair up: the whole batch.
    """
    sizes = {len(t) if torch.is_tensor(t) and t.dim() else 0 for t in batch}
    rows = sizes.pop() if len(sizes) == 1 else 0
    if rows < WORLD_SIZE:
        return model(*batch)
    mine = torch.arange(RANK, rows, WORLD_SIZE, device=batch[0].device)
    out = model(*(t[mine] for t in batch))
    counted = torch.ones_like(batch[targets], dtype=torch.bool) if ignored is None else batch[targets] != ignored
    share = (out if loss_at is None else out[loss_at]) * (counted[mine].sum() * WORLD_SIZE / counted.sum())
    whole = share.detach().clone()
    dist.all_reduce(whole)
    loss = share + (whole / WORLD_SIZE - share.detach())
    return loss if loss_at is None else (*out[:loss_at], loss, *out[loss_at + 1:])
'''

TENSORS_HELPER = '''

def broadcast_tensors(*tensors):
    """Rank 0's values of tensors trained by hand, on every rank."""
    # as a DDP wrap starts a model's parameters alike (through this rank's
    # device: NCCL takes no CPU tensor)
    for tensor in tensors:
        value = tensor.data.to(RANK_DEVICE)
        dist.broadcast(value, src=0)
        tensor.data.copy_(value)


def average_tensor_gradients(*tensors):
    """Each tensor's gradient averaged over the ranks, as DDP averages a
    model's: tensors trained by hand, with no module to wrap."""
    for tensor in tensors:
        dist.all_reduce(tensor.grad)
        tensor.grad /= WORLD_SIZE
'''

SHARD_CALL = "evaluation_shard"
SUMS_CALL = "all_reduce_sums"
GATHER_CALL = "all_gather_lists"
MEAN_CALL = "mean_over_ranks"
MODULE_CALL = "evaluation_module"
PLAIN_CALL = "plain_model"
EVERY_CALL = "on_every_rank"
ANY_CALL = "on_any_rank"
BROADCAST_CALL = "broadcast_parameters"
AVERAGE_CALL = "average_gradients"
ROWS_CALL = "loss_of_rank_rows"
RANK_ROWS_CALL = "rows_of_rank"  # in ROWS_HELPER
TENSORS_CALL = "average_tensor_gradients"
TENSORS_BROADCAST_CALL = "broadcast_tensors"
MODEL_ROWS_CALL = "model_loss_of_rank_rows"
# each helper's code, in the order they are added to a script (after cleanup_distributed)
EVALUATION_HELPERS = {SHARD_CALL: SHARD_HELPER, MODULE_CALL: MODULE_HELPER, PLAIN_CALL: PLAIN_HELPER, SUMS_CALL: SUMS_HELPER, GATHER_CALL: GATHER_HELPER, MEAN_CALL: MEAN_HELPER,
                      ROWS_CALL: ROWS_HELPER, MODEL_ROWS_CALL: MODEL_ROWS_HELPER, TENSORS_CALL: TENSORS_HELPER, EVERY_CALL: AGREE_HELPER, BROADCAST_CALL: AVERAGE_HELPER}
# the functions ddpify adds at the top of a script: new helpers go after the last one present
ADDED_FUNCTIONS = ("setup_distributed", "cleanup_distributed", *EVALUATION_HELPERS, "_summed", "_flattened", "_shaped_like", RANK_ROWS_CALL, ANY_CALL, AVERAGE_CALL,
                   TENSORS_BROADCAST_CALL)
