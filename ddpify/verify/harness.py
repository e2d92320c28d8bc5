"""Run one training script, unmodified, under hooks that record every optimizer step.

Used in a process forked by the launcher (`run_role`) or as a torchrun worker
(`python -m ddpify.verify.harness PLAN_JSON ROLE`). Before the script starts it:
makes torch deterministic, switches dropout off, captures the tensor each backward
starts from (unscaled when it came from a GradScaler), watches for `reduction='sum'`
losses, the candidate's plain BatchNorm, float16/bfloat16 autocast and products pairing a
rank's rows with each other, makes the reference's plain BatchNorm normalize each rank's part
of a split batch separately where the candidate's does (see rank_batchnorm), re-cuts the reference's training
batches (see alignment), simulates DataParallel's replicas for a dp candidate on fewer than
two GPUs (see dataparallel), and arms a faulthandler dump for hangs. After `plan.steps` optimizer steps, or when
the script ends, it writes its record (see recorder) and leaves at once with os._exit, so no
rank blocks in teardown.

Imports torch and the standard library only (with ddpify's own small modules): no libcst, no ddpify command code.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import inspect
import io
import os
import random
import runpy
import signal
import sys
import time
import traceback
import weakref

from ddpify.collector import FEWER_COLLECTIONS

with FEWER_COLLECTIONS:  # a torchrun worker imports torch here; the script runs at the thresholds it started with
    import torch
    import torch.nn.functional as F
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ddpify.anatomy.distributed.names import NUMPY_NON_DRAWS
from ddpify.anatomy.vocabulary import MODEL_WRAPPERS, RANDOM_DRAWS
from ddpify.verify.aligned_draws import TrainingBatch, batch_shaped_draw, seed_torch, watch_training_batches
from ddpify.verify.alignment import PassClock, align_training_loaders, clock_passes_at_start
from ddpify.verify.dataparallel import simulate_data_parallel
from ddpify.verify.plan import CANDIDATE, PACKAGE_ROOT, PAIRS_FLAG, REFERENCE, WRAPPER_FLAG, Plan, Run, ScriptBatch
from ddpify.verify.rank_batchnorm import normalize_batchnorm_per_rank
from ddpify.verify.recorder import Recorder
from ddpify.verify.wrap_order import watch_moves_after_wrap

SEED = 0
SHARED_GPU_ENV = "DDPIFY_VERIFY_SHARED_GPU"
DEADLINE_ENV = "DDPIFY_VERIFY_DEADLINE"  # wall-clock time at which every process dumps its stacks
PR_SET_PDEATHSIG = 1
MT19937_KEY_BYTES = 624 * 4  # NumPy's Mersenne Twister state: 624 uint32 key words, then the int position
# products of two tensors, by their owners: `x @ y.t()` pairs each row of x with each row of y
ROW_PRODUCTS = ((torch, (torch.matmul, torch.mm, torch.cdist)),
                (torch.Tensor, (torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.__matmul__)))
DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


def make_deterministic() -> None:
    """Same seeds, deterministic kernels, no TF32, one thread.

    Sets the flag behind torch.use_deterministic_algorithms(True, warn_only=True) directly:
    the public call also imports torch._inductor.config, which costs more CPU than the rest
    of verify's start-up (and only matters to torch.compile).
    """
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    random.seed(SEED)


def seed_numpy(role: str) -> None:
    """Start numpy's global generator as a process of its own would, but repeatably: the reference's from SEED
    (as torch's and Python's), each candidate rank's from SEED + its rank (forked ranks would otherwise share
    the launcher's state, which no two torchrun ranks do). Where a script draws its data from numpy unseeded,
    the converter seeds it with the same 0 on every rank (codemods/ddp/rows.py): its ranks then draw the
    reference's numbers, and a port that forgot that seed diverges."""
    numpy = sys.modules.get("numpy")  # torch imports it where it is installed
    if numpy:
        numpy.random.seed(SEED if role == REFERENCE else SEED + int(os.environ.get("RANK", "0")))


def _arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by name, defaults included."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def disable_dropout(recorder: Recorder) -> None:
    """Make every functional dropout (hence nn.Dropout & co.) the identity, and attention dropout zero."""
    for name in DROPOUT_FUNCTIONS:
        signature = inspect.signature(getattr(F, name))

        def identity(*args, _signature=signature, _name=name, **kwargs):
            arguments = _arguments(_signature, args, kwargs)
            if arguments["training"] and arguments["p"] > 0:
                recorder.flag("dropout", f"the script uses dropout (F.{_name}, p={arguments['p']:g}); it is switched off in both runs")
            return arguments["input"]

        setattr(F, name, identity)
    attention = F.scaled_dot_product_attention

    def attention_without_dropout(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs):
        """nn.MultiheadAttention and the Transformer layers send their attention dropout here."""
        if dropout_p > 0:
            recorder.flag("attention_dropout", f"the script uses attention dropout (scaled_dot_product_attention "
                                               f"dropout_p={dropout_p:g}); it is switched off in both runs")
        return attention(query, key, value, attn_mask, 0.0, *args, **kwargs)

    F.scaled_dot_product_attention = attention_without_dropout


class SeededSample:
    """How deep the running code is in a sample that seed_each_sample seeded: its draws are alike in both runs."""

    depth = 0


def seed_each_sample(recorder: Recorder) -> None:
    """Random draws inside `Dataset.__getitem__` (augmentation, noise) come from generators seeded
    by the sample's index and the training epoch, so both runs see the same data however the
    ranks split the batches. The global random states are restored after each batch's samples,
    before its collate_fn (saved and restored once a batch: NumPy's state alone costs ~70 us)."""
    from torch.utils.data._utils.fetch import _MapDatasetFetcher

    def seeded_sample(dataset, index):
        _seed_everything(hash((SEED, index, PassClock.epoch)) & 0xFFFFFFFF)
        watching = "sample_randomness" not in recorder.flags  # until the first sample that draws
        seeded = _draw_marks() if watching else None
        SeededSample.depth += 1
        try:
            item = dataset[index]
        finally:
            SeededSample.depth -= 1
        if watching and not _same_marks(seeded, _draw_marks()):
            recorder.flag("sample_randomness", "the dataset draws random numbers per sample (augmentation, noise): "
                                               "both runs seed them by sample index and epoch, so they see the same data")
        return item

    def samples(dataset, indices) -> list:
        saved = _random_states()
        try:
            return [seeded_sample(dataset, index) for index in indices]
        finally:
            _restore_random_states(saved)

    def fetch(self, possibly_batched_index):
        if self.auto_collation:
            return self.collate_fn(samples(self.dataset, possibly_batched_index))
        return self.collate_fn(samples(self.dataset, [possibly_batched_index])[0])

    clock_passes_at_start()
    _MapDatasetFetcher.fetch = fetch


def _random_states() -> tuple:
    numpy = sys.modules.get("numpy")
    return random.getstate(), torch.get_rng_state(), numpy.random.get_state() if numpy else None


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    seed_torch(seed)
    numpy = sys.modules.get("numpy")
    if numpy:
        numpy.random.seed(seed)


def _draw_marks() -> tuple:
    """What any draw from a freshly seeded global generator changes: Python's and torch's states, and
    NumPy's Mersenne Twister position and first key word (a draw moves the position, or after exactly
    624 words renews the key). The copy of NumPy's whole state, get_state(), would cost ~33 us a sample."""
    numpy = sys.modules.get("numpy")
    return random.getstate(), torch.get_rng_state(), _numpy_mark(numpy) if numpy else None


def _same_marks(a: tuple, b: tuple) -> bool:
    """Did no generator draw between these two _draw_marks()?"""
    return a[0] == b[0] and a[2] == b[2] and torch.equal(a[1], b[1])


def _numpy_mark(numpy) -> tuple[int, int]:
    """(first key word, position) of NumPy's global MT19937, read in place through its ctypes interface
    (the state struct: 624 key words, then the position); from get_state() where that interface is missing."""
    try:
        address = numpy.random.mtrand._rand._bit_generator.ctypes.state_address
    except AttributeError:
        state = numpy.random.get_state()
        return int(state[1][0]), int(state[2])
    return ctypes.c_uint32.from_address(address).value, ctypes.c_int.from_address(address + MT19937_KEY_BYTES).value


def _restore_random_states(states: tuple) -> None:
    python_state, torch_state, numpy_state = states
    random.setstate(python_state)
    torch.set_rng_state(torch_state)
    numpy = sys.modules.get("numpy")
    if numpy and numpy_state is not None:
        numpy.random.set_state(numpy_state)


def _reduction_signatures() -> dict[str, inspect.Signature]:
    """torch.nn.functional's public functions that take `reduction`, by name, with their signatures."""
    found = {}
    for name in dir(F):
        function = getattr(F, name)
        if name.startswith("_") or not callable(function):
            continue
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            continue
        if "reduction" in signature.parameters:
            found[name] = signature
    return found


# Found once, at import: the roles the launcher forks share it (the scan reads ~150 signatures, copying
# sys.modules for those of builtins: 10-20 ms a process).
REDUCTION_SIGNATURES = _reduction_signatures()


def watch_sum_reduction(recorder: Recorder) -> None:
    """Flag losses computed with reduction='sum' while autograd records (eval losses are ignored)."""
    for name, signature in REDUCTION_SIGNATURES.items():
        function = getattr(F, name)

        def watched(*args, _function=function, _signature=signature, _name=name, **kwargs):
            if torch.is_grad_enabled() and _arguments(_signature, args, kwargs)["reduction"] == "sum":
                recorder.flag("sum_reduction", f"{_name}(reduction='sum')")
            return _function(*args, **kwargs)

        setattr(F, name, watched)


def watch_training_randomness(recorder: Recorder, world: int = 1, rank: int = 0) -> None:
    """Flag random draws from torch's or numpy's global generator made while autograd records, inside a
    module's forward (a VAE's `torch.randn_like` noise) or once training forwards have run (a GAN's noise
    for the next step, a `get_batch()` drawing offsets, rows picked by `np.random.choice`), with where they
    were drawn and a fingerprint of each: split over ranks, each may draw other numbers than the single
    process does (compare tells). Draws of a sample seed_each_sample seeded are alike in both runs: not flagged.
    Noise drawn for the training batch is drawn alike (aligned_draws; `world` ranks' rows, this one's `rank`); the
    flag names the first draw that is not, where there is one."""
    depth, trained, named_unaligned = [0], [False], [False]

    def entered(module, args):
        depth[0] += 1

    def left(module, args, output):
        depth[0] -= 1
        trained[0] = trained[0] or (module.training and torch.is_grad_enabled())

    def watch(owner, name: str, label: str) -> None:
        function = getattr(owner, name)

        def watched(*args, **kwargs):
            drawn = function(*args, **kwargs)
            if not torch.is_grad_enabled() or kwargs.get("generator") is not None or SeededSample.depth:
                return drawn
            aligned = batch_shaped_draw(owner, name, args, kwargs, drawn, world, rank)
            if aligned or depth[0] > 0 or trained[0]:
                where = "in a forward" if depth[0] > 0 else "between training steps"
                detail = f"{label} {where}, in {_caller(sys._getframe(1))}"
                if aligned or named_unaligned[0]:
                    recorder.flag("training_randomness", detail)
                else:  # the first draw not drawn alike names the flag: it is what may keep the runs apart
                    recorder.flags["training_randomness"], named_unaligned[0] = detail, True
                drawn, whole = aligned or (drawn, drawn)
                recorder.drew(args[0] if whole is None else whole)  # np.random.shuffle(x) draws into x
            return drawn

        setattr(owner, name, watched)

    register_module_forward_pre_hook(entered)
    register_module_forward_hook(left)
    for name in RANDOM_DRAWS:
        watch(torch, name, f"torch.{name}")
    for name in _numpy_draws():
        watch(sys.modules["numpy"].random, name, f"numpy.random.{name}")


def _numpy_draws() -> list[str]:
    """The functions of numpy.random that draw from its global generator (`np.random.normal`, `choice`, ...)."""
    numpy = sys.modules.get("numpy")  # torch imports it where it is installed
    if numpy is None:
        return []
    generator = numpy.random.mtrand._rand
    return [name for name in dir(numpy.random)
            if name not in NUMPY_NON_DRAWS and getattr(getattr(numpy.random, name), "__self__", None) is generator]


def _caller(frame) -> str:
    """`function() at file:line` of a frame (`<module> at file:line` at module level)."""
    name = frame.f_code.co_name
    function = name if name.startswith("<") else f"{name}()"
    return f"{function} at {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def watch_plain_batchnorm(recorder: Recorder) -> None:
    """Flag BatchNorm layers (not SyncBatchNorm, which overrides forward) used in training mode: where the
    reference does not split them per rank, such a candidate matches it only statistically."""
    forward = _BatchNorm.forward

    def watched(self, input):
        if self.training:
            recorder.flag("plain_batchnorm", type(self).__name__)
        return forward(self, input)

    _BatchNorm.forward = watched


def watch_batch_pairs(recorder: Recorder) -> None:
    """Flag a product that pairs the training batch's rows with each other while autograd records (`unit @ unit.t()`
    of a pull-away term or a contrastive loss, `torch.cdist(x, y)`): a rows x rows result that takes a gradient,
    of operands that are no parameters (nor views of one). Each rank pairs its own rows only, so the mean of the
    ranks' terms is not the whole batch's, which pairs rows across ranks too: compare tells."""
    for owner, products in ROW_PRODUCTS:
        for product in products:
            setattr(owner, product.__name__, _watched_product(product, recorder))


def _watched_product(product, recorder: Recorder):
    """`product`, flagging a call whose result pairs the training batch's rows (see watch_batch_pairs)."""

    def watched(*args, **kwargs):
        result = product(*args, **kwargs)
        rows = TrainingBatch.rows
        if (torch.is_tensor(result) and result.requires_grad and rows and rows > 1 and tuple(result.shape) == (rows, rows)
                and not any(_of_a_parameter(operand) for operand in args if torch.is_tensor(operand))):
            recorder.flag(PAIRS_FLAG, f"{product.__name__.strip('_')} in {_caller(sys._getframe(1))}: {rows} x {rows}, "
                                      f"a rank's {rows} rows by each other")
        return result

    return watched


def _of_a_parameter(tensor: torch.Tensor) -> bool:
    """Is `tensor` a parameter, or a view of one (`weight.t()`)?"""
    return isinstance(tensor if tensor._base is None else tensor._base, torch.nn.Parameter)


def watch_reduced_precision(recorder: Recorder) -> None:
    """Flag an enabled float16/bfloat16 autocast: its matmuls round differently when a batch is split."""
    enter = torch.autocast.__enter__

    def watched(self):
        if self._enabled and self.fast_dtype in (torch.float16, torch.bfloat16):
            recorder.flag("reduced_precision", f"autocast({self.device!r}, {self.fast_dtype})")
        return enter(self)

    torch.autocast.__enter__ = watched


def watch_wrapper_forwards(recorder: Recorder, fsdp: bool) -> None:
    """Flag the first forward through a multi-GPU wrapper (DDP, DataParallel, legacy FSDP, or, with `fsdp`, a
    module that `fully_shard` sharded): a candidate that never runs one is not converted. With `fsdp`, also
    flag `fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=float16/bfloat16))`: the candidate
    then computes with rounded parameters where the reference uses float32 ones."""
    sharded: weakref.WeakSet = weakref.WeakSet()

    def entered(module, args):
        if WRAPPER_FLAG not in recorder.flags and (module in sharded or _is_model_wrapper(module)):
            recorder.flag(WRAPPER_FLAG, type(module).__name__)

    register_module_forward_pre_hook(entered)
    if not fsdp:
        return
    import torch.distributed.fsdp as fsdp_module

    shard = fsdp_module.fully_shard

    @functools.wraps(shard)
    def watched(module, *args, **kwargs):
        dtype = getattr(kwargs.get("mp_policy"), "param_dtype", None)
        if dtype in (torch.float16, torch.bfloat16):
            recorder.flag("low_precision_parameters", f"fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype={dtype}))")
        sharded.update(module if isinstance(module, (list, tuple)) else [module])
        return shard(module, *args, **kwargs)

    fsdp_module.fully_shard = watched


def _is_model_wrapper(module: torch.nn.Module) -> bool:
    """Is `module` one of the wrappers of MODEL_WRAPPERS? (Their modules are imported where one was built.)"""
    for name in MODEL_WRAPPERS:
        package, _, cls = name.rpartition(".")
        wrapper = getattr(sys.modules.get(package), cls, None)
        if wrapper is not None and isinstance(module, wrapper):
            return True
    return False


def capture_backward(recorder: Recorder) -> None:
    """Record the tensor each backward starts from; Tensor.backward goes through autograd.backward."""
    backward = torch.autograd.backward
    scale = torch.amp.GradScaler.scale

    def recorded_backward(tensors, *args, **kwargs):
        recorder.on_backward(tensors if isinstance(tensors, torch.Tensor) else next(iter(tensors)))
        return backward(tensors, *args, **kwargs)

    def remembered_scale(self, outputs):
        scaled = scale(self, outputs)
        if isinstance(outputs, torch.Tensor):
            recorder.scaled = (scaled, outputs)
        return scaled

    torch.autograd.backward = recorded_backward
    torch.amp.GradScaler.scale = remembered_scale


def track_optimizers(recorder: Recorder) -> None:
    """Tell the recorder of every optimizer built (each subclass's __init__ calls Optimizer's)."""
    init = torch.optim.Optimizer.__init__

    @functools.wraps(init)
    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        recorder.on_optimizer(self)

    torch.optim.Optimizer.__init__ = tracked


def capture_manual_updates(recorder: Recorder) -> None:
    """Count `Module.zero_grad()` after an un-stepped backward as a step (updates written by hand)."""
    zero_grad = torch.nn.Module.zero_grad

    def recorded_zero_grad(self, *args, **kwargs):
        recorder.on_zero_grad(self)
        return zero_grad(self, *args, **kwargs)

    torch.nn.Module.zero_grad = recorded_zero_grad


def share_single_gpu() -> None:
    """N ranks on one GPU: every rank uses cuda:0 and gloo (nccl refuses duplicate GPUs)."""
    import torch.distributed as dist

    init_process_group = dist.init_process_group
    os.environ["LOCAL_RANK"] = "0"

    def gloo_init(*args, **kwargs):
        kwargs.pop("backend", None)
        return init_process_group("gloo", *args[1:], **kwargs)

    dist.init_process_group = gloo_init


def die_with_parent() -> None:
    """On Linux, get SIGKILLed when the parent dies: torchrun starts its workers in sessions
    of their own, out of reach of the kill of the launcher's process group."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def arm_stack_dump(path: str) -> None:
    """Dump every thread's stack into `path` at the launcher's deadline, in case this process hangs, or
    as it dies of a fatal signal (a C++ abort) before that (faulthandler keeps the file open)."""
    delay = max(float(os.environ[DEADLINE_ENV]) - time.time(), 0.1)
    dump = open(path, "w")
    faulthandler.enable(file=dump)
    faulthandler.dump_traceback_later(delay, file=dump)


def redirect_output(path: str) -> None:
    """Send this process's stdout and stderr (file descriptors included) to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def run_script(run: Run, args: tuple[str, ...], batch: ScriptBatch | None = None, world: int = 1) -> None:
    """Run the script as `__main__` the way `python script.py args` would, typed where it runs; with
    `batch`, its batch set to `world` times the script's where the script sets it (see ScriptBatch)."""
    typed = run.argv0 or run.script  # relative to the working directory, which mirrors the user's
    sys.argv = [typed, *(batch.argv(args, world) if batch else args)]
    sys.path[0] = run.import_dir
    with io.open_code(run.script) as f:  # frames name the real file (hang reports find it); argv[0] stays as typed
        text = f.read()
    code = compile(batch.source(text.decode(), world) if batch else text, run.script, "exec")
    runpy._run_module_code(code, None, "__main__", script_name=typed)


def install_hooks(plan: Plan, role: str, recorder: Recorder) -> None:
    make_deterministic()
    seed_numpy(role)
    disable_dropout(recorder)
    seed_each_sample(recorder)
    watch_sum_reduction(recorder)
    watch_reduced_precision(recorder)
    watch_training_batches()
    splits = role == CANDIDATE and plan.aligns_reference()  # each rank draws its rows of the reference's batch
    watch_training_randomness(recorder, plan.nproc if splits else 1, int(os.environ.get("RANK", "0")) if splits else 0)
    capture_backward(recorder)
    track_optimizers(recorder)
    register_optimizer_step_pre_hook(recorder.before_step)
    capture_manual_updates(recorder)
    register_optimizer_step_post_hook(recorder.on_step)
    if role == REFERENCE and plan.ranks_normalize_apart():
        normalize_batchnorm_per_rank(plan.batch_parts, plan.distributed, recorder.flag)
    if role == CANDIDATE:
        watch_plain_batchnorm(recorder)
    if role == CANDIDATE and plan.averages_across_ranks():
        watch_batch_pairs(recorder)
    if role == REFERENCE and plan.aligns_reference():
        script = os.path.realpath(plan.reference.script)
        static_sites = {(script, line) for line in plan.reference_training_lines}
        epoch_loops: dict = {}
        for line, *loop in plan.reference_epoch_loops:
            epoch_loops.setdefault((script, line), []).append(tuple(loop))
        batch_mode = "global" if plan.global_batch else plan.batch_mode  # the script's batch made N ranks' own
        align_training_loaders(plan.nproc, batch_mode, static_sites, recorder, epoch_loops, accelerate=plan.target == "accelerate")
    if role == CANDIDATE:
        watch_wrapper_forwards(recorder, fsdp=plan.target == "fsdp")
        watch_moves_after_wrap(recorder.flag)
    if role == CANDIDATE and os.environ.get(SHARED_GPU_ENV):
        share_single_gpu()
    if role == CANDIDATE and plan.dp_simulated:
        simulate_data_parallel(plan.dp_replicas, recorder.flag)


def follow_pythonpath_into_mirror(started_in: str, home: str, mirror: str) -> None:
    """PYTHONPATH entries name folders of the user's: follow them into this side's mirror. Entries written
    relative (`.`, `..`, `src`) name folders of the working directory, which Python resolved against the one
    this process started in (the launcher's): resolve them against the run's (this side's mirror of the
    user's), so `PYTHONPATH=.. python train.py` imports the side's own package; absolute ones inside the
    mirrored `home` (not ddpify's own) lead to their copy in `mirror`, where the candidate's converted modules are."""
    for entry in filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        stale = os.path.normpath(os.path.join(started_in, entry))
        if not os.path.isabs(entry):
            fresh = os.path.abspath(entry)
        elif home and entry != PACKAGE_ROOT and os.path.commonpath([os.path.realpath(stale), home]) == home:
            fresh = os.path.join(mirror, os.path.relpath(os.path.realpath(stale), home))
        else:
            continue
        sys.path[:] = [fresh if path == stale else path for path in sys.path]


def run_role(plan: Plan, role: str):
    """Run the plan's `role` script as rank $RANK under the hooks; never returns."""
    rank = int(os.environ.get("RANK", "0"))
    run = plan.run(role)
    die_with_parent()
    started_in = os.getcwd()
    os.chdir(run.workdir)
    follow_pythonpath_into_mirror(started_in, plan.home, run.root)
    redirect_output(plan.file("log", role, rank))
    arm_stack_dump(plan.file("stack", role, rank))
    recorder = Recorder(plan.file("record", role, rank), plan.steps)
    install_hooks(plan, role, recorder)
    try:
        run_script(run, plan.script_args, plan.script_batch if role == REFERENCE and plan.global_batch else None, plan.nproc)
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            _fail(plan.file("error", role, rank), recorder)
    except BaseException:
        _fail(plan.file("error", role, rank), recorder)
    recorder.finish(0)


def _fail(error_path: str, recorder: Recorder):
    """Write the current exception's traceback next to the partial record, and exit 1."""
    text = traceback.format_exc()
    sys.stderr.write(text)
    with open(error_path, "w") as f:
        f.write(text)
    recorder.finish(1)


if __name__ == "__main__":
    run_role(Plan.load(sys.argv[1]), sys.argv[2])
