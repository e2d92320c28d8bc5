"""Re-cut the reference run's training batches to match the candidate's DDP ranks.

DistributedSampler gives rank r the slice `indices[r::N]` of `randperm(n)` seeded with
`seed + epoch` (padded to a multiple of N), and each rank batches its own slice. For
step k of the single reference process to see exactly the union of what the N ranks
see at their step k, every training DataLoader the reference creates gets an
AlignedBatchSampler: it rebuilds the N slices with DistributedSampler itself and
concatenates the k-th batch of every rank. Each pass over a training loader inside one of its
epoch loops is one more epoch from where that loop counts (the candidate's `set_epoch(epoch)`),
counted per call site so that a loader rebuilt every epoch keeps counting; a pass outside its
epoch loops keeps the epoch last set, and with no epoch loop known each pass is one more epoch.
Evaluation loaders are left alone, and so are those that sample with replacement (converted, each rank
draws from a generator seeded with the rank): no reference draws what the ranks draw, so they flag
training randomness and the runs are compared in statistical mode.

An Accelerate candidate's prepared loader deals the script's own batches to the ranks instead
(Accelerate's BatchSamplerShard: batch i to rank i % N, the last ones filled from the start),
shuffled by use_seedable_sampler's generator (torch's initial seed plus the epoch: the number of passes the
loader completed, counted from the epoch the converted script sets after preparing a loader it builds inside an
epoch loop, so that one rebuilt every epoch reshuffles as the original's does): AcceleratedBatchSampler rebuilds those with Accelerate's
own classes, and step k joins every rank's k-th batch. A loader with a sampler of the script's own
(WeightedRandomSampler, any sampler object it passes) is dealt the same way: every process draws the same
sequence from it (Accelerate keeps the sampler's generator the same on every process), so one pass of the
reference's own sampler is dealt (AcceleratedOwnSampler), except where the sampler has no generator yet
(Accelerate seeds one from the global generator at prepare, which no reference can mirror). A loader over an
IterableDataset is iterated by process 0 alone, which concatenates N of its batches (one with split_batches)
and gives each rank its rows (Accelerate's DataLoaderDispatcher): the reference's step k joins its own
batches kN..kN+N-1 (dispatched_steps). A DDP candidate's converter leaves both kinds unsharded, so its
reference keeps them as they are.

Imports torch and the standard library only (and accelerate, for an Accelerate candidate).
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import weakref
from itertools import islice
from typing import Callable, Collection, Iterable, Iterator

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

DISTRIBUTED_SAMPLER_SEED = 0  # DistributedSampler's default, which converted scripts keep
RECUT_FLAG = "recut_loader"  # the record's flags: a training loader was re-cut (detail: how, and where it was made)


class LoaderCensus:
    """What the training-loader decision may depend on, gathered while the script runs."""

    def __init__(self, static_sites: set[tuple[str, int]], epoch_loops: dict[tuple[str, int], list[tuple[int, int, int]]] | None = None) -> None:
        self.static_sites = static_sites  # (file, line) of DataLoader calls static analysis saw train
        # (file, line) -> the epoch loops around it that call set_epoch: (first line, last line, first epoch)
        self.epoch_loops = epoch_loops or {}
        self.known_training = 0  # loaders created shuffled or at a static training site
        self.training_sites: set[tuple[str, int]] = set()  # sites whose loaders were judged training
        self.training_iterated = False
        self.optimizer_stepped = False
        self.passes: dict[tuple, int] = {}  # training passes started, per DataLoader call site (and epoch loop)
        self.set_epochs: dict[tuple[str, int], int] = {}  # the epoch each site's sampler was last set to

    def next_epoch(self, site: tuple[str, int], running: Collection[int] = ()) -> int:
        """The epoch of a new pass over a training loader created at `site` (file, line), started while
        the lines `running` of its file are on the stack: the one the candidate's sampler has then.

        Inside an epoch loop of the loader, the candidate's `set_epoch(epoch)` numbers its passes from
        where the loop counts from (`range(1, n)`: 1); a pass outside them keeps the epoch last set
        (a warm-up pass before the epochs sees the first epoch's order). With no epoch loop known,
        each pass is one more epoch.
        """
        known = self.epoch_loops.get(site)
        if not known:
            return self._count(site, 0)
        loops = [loop for loop in known if any(loop[0] <= line <= loop[1] for line in running)]
        if not loops:
            return self.set_epochs.get(site, 0)
        loop = max(loops)  # the innermost: it starts last
        self.set_epochs[site] = self._count((site, loop), loop[2])
        return self.set_epochs[site]

    def _count(self, key: tuple, first: int) -> int:
        passes = self.passes.get(key, 0)
        self.passes[key] = passes + 1
        return first + passes


def is_training_loader(site: tuple[str, int], shuffle: bool, census: LoaderCensus) -> bool:
    """Whether a loader feeds training (aligned) or evaluation (left alone): the one place that decides.

    Loaders created where static analysis (ddpify.anatomy) saw a training loop iterate them
    train, and so do shuffled ones and loaders rebuilt where a training loader was built before
    (each epoch, by a function of another module); when the script has none of these, the first
    loader iterated before any optimizer step does.
    """
    if shuffle or site in census.static_sites or site in census.training_sites:
        return True
    return not (census.known_training or census.training_iterated or census.optimizer_stepped)


class PassClock:
    """The epoch of the training pass in progress, as the samplers count it (DistributedSampler's
    `set_epoch` in the candidate, the census in the reference): per-sample seeds read it."""

    epoch = 0


def clock_passes_at_start() -> None:
    """Set PassClock.epoch as a pass over a DataLoader starts (`iter(loader)`), before the loader forks its
    worker processes, which keep the value they were forked with: a batch sampler runs its body only once
    the workers are up, too late for them. The epoch is the pass's own: its DistributedSampler's
    (the candidate's `set_epoch`), or the one an AlignedBatchSampler's census gives it (the reference's)."""
    iterate = DataLoader.__iter__

    def starting(self):
        if isinstance(self.batch_sampler, AlignedBatchSampler):
            self.batch_sampler.start_pass()
        elif isinstance(self.sampler, DistributedSampler):
            PassClock.epoch = self.sampler.epoch
        return iterate(self)

    DataLoader.__iter__ = starting


class JudgedLoader:
    """One reference loader that decides on first use whether it trains (is_training_loader), and then
    calls `on_training` with itself once."""

    def __init__(self, site: tuple[str, int], shuffle: bool, census: LoaderCensus, on_training: Callable) -> None:
        self.site = site
        self.shuffle = shuffle
        self.census = census
        self.on_training = on_training
        self.training: bool | None = None

    def _is_training(self) -> bool:
        if self.training is None:
            self.training = is_training_loader(self.site, self.shuffle, self.census)
            if self.training:
                self.census.training_iterated = True
                self.census.training_sites.add(self.site)
                self.on_training(self)
        return self.training


class AlignedBatchSampler(JudgedLoader):
    """Batch sampler of one reference loader; decides on first use whether it trains.

    Training: batch k is the concatenation over ranks of each rank's k-th DistributedSampler
    batch, and each pass has the epoch the candidate's sampler has then (LoaderCensus.next_epoch).
    Evaluation: the loader's own sequential batches.
    """

    def __init__(self, site: tuple[str, int], size: int, batch_size: int, per_rank_batch: int, drop_last: bool, shuffle: bool,
                 world: int, census: LoaderCensus, on_training: Callable[[AlignedBatchSampler], None]) -> None:
        super().__init__(site, shuffle, census, on_training)
        self.size = size
        self.batch_size = batch_size
        self.per_rank_batch = per_rank_batch
        self.drop_last = drop_last
        self.world = world
        self.started: int | None = None  # the epoch of a training pass started but not yet iterated

    def dealing(self) -> str:
        """How a training pass orders and deals the samples, for the notes."""
        return f"{self._order_named()} as DistributedSampler(seed={DISTRIBUTED_SAMPLER_SEED}) with set_epoch per pass"

    def _order_named(self) -> str:
        return "shuffled" if self.shuffle else "in order"

    def _own_batches(self) -> BatchSampler:
        return BatchSampler(SequentialSampler(range(self.size)), self.batch_size, self.drop_last)

    def rank_slices(self, epoch: int) -> list[list[int]]:
        """The indices each rank's DistributedSampler yields in `epoch`."""
        slices = []
        for rank in range(self.world):
            sampler = DistributedSampler(range(self.size), num_replicas=self.world, rank=rank,
                                         shuffle=self.shuffle, seed=DISTRIBUTED_SAMPLER_SEED)
            sampler.set_epoch(epoch)
            slices.append(list(sampler))
        return slices

    def _aligned_len(self) -> int:
        per_rank = math.ceil(self.size / self.world)
        return per_rank // self.per_rank_batch if self.drop_last else math.ceil(per_rank / self.per_rank_batch)

    def __len__(self) -> int:
        return self._aligned_len() if self._is_training() else len(self._own_batches())

    def start_pass(self) -> None:
        """Number a new training pass (LoaderCensus.next_epoch) and set the PassClock to it."""
        if self._is_training():
            self.started = PassClock.epoch = self.census.next_epoch(self.site, _lines_running(self.site[0]))

    def __iter__(self):
        if not self._is_training():
            yield from self._own_batches()
            return
        if self.started is None:  # iterated without a DataLoader's iter() (see clock_passes_at_start)
            self.start_pass()
        epoch, self.started = self.started, None
        slices = self.rank_slices(epoch)
        b = self.per_rank_batch
        for k in range(self._aligned_len()):
            yield [index for indices in slices for index in indices[k * b:(k + 1) * b]]


class AcceleratedBatchSampler(AlignedBatchSampler):
    """Batch sampler of one reference loader of an Accelerate candidate (see the module's docstring);
    `split`: Accelerator(split_batches=True), which splits each batch over the ranks."""

    def __init__(self, *args, split: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.split = split
        self.initial_seed = torch.initial_seed()  # what SeedableRandomSampler reads when the loader is prepared
        self.passes = 0
        self.first_epoch: int | None = None  # the epoch of its first pass (see _pass_epoch)

    def _shards(self, order) -> list:
        from accelerate.data_loader import BatchSamplerShard

        batches = BatchSampler(order, self.batch_size, self.drop_last)
        return [BatchSamplerShard(batches, self.world, rank, split_batches=self.split) for rank in range(self.world)]

    def dealing(self) -> str:
        return f"{self._order_named()} as Accelerate's prepared loader deals the batches (seedable sampler, an epoch per completed pass)"

    def start_pass(self) -> None:
        """Nothing: an Accelerate candidate's prepared loaders have no DistributedSampler to set the PassClock, so
        the reference's passes leave it alone too."""

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator()
        generator.manual_seed(self.initial_seed + self._pass_epoch())
        return torch.randperm(self.size, generator=generator).tolist()

    def _pass_epoch(self) -> int:
        """The epoch of this pass as the candidate's prepared loader has it: the passes it completed, from the epoch
        the converted script sets after preparing it where it is built inside an epoch loop (its `set_epoch(epoch)`,
        numbered as LoaderCensus.next_epoch numbers DistributedSampler's), from 0 otherwise."""
        if self.first_epoch is None:
            built_each_epoch = any(first <= self.site[1] <= last for first, last, _ in self.census.epoch_loops.get(self.site, ()))
            self.first_epoch = self.census.next_epoch(self.site, _lines_running(self.site[0])) if built_each_epoch else 0
        return self.first_epoch + self.passes

    def _aligned_len(self) -> int:
        return len(self._shards(range(self.size))[0])

    def __iter__(self):
        if not self._is_training():
            yield from self._own_batches()
            return
        for step in zip(*self._shards(self._order())):
            yield [index for batch in step for index in batch]
        self.passes += 1  # a prepared loader counts its epochs by the passes it completes


class AcceleratedOwnSampler(AcceleratedBatchSampler):
    """Batch sampler of one reference loader with a sampler of the script's own (`sampler`), for an Accelerate
    candidate: every process draws the same sequence from it, and the prepared loaders deal its batches like
    any others; a training pass draws the sampler once and deals that. Evaluation: the sampler's own batches."""

    def __init__(self, *args, sampler, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sampler = sampler

    def dealing(self) -> str:
        return (f"drawn by its own {type(self.sampler).__name__} (the same draws on every process), as Accelerate's prepared "
                "loader deals the batches")

    def _own_batches(self) -> BatchSampler:
        return BatchSampler(self.sampler, self.batch_size, self.drop_last)

    def _order(self) -> list[int]:
        return list(self.sampler)


class DispatchedStream(JudgedLoader):
    """One reference loader over an IterableDataset, for an Accelerate candidate: its training passes are
    dispatched_steps of its own batches (`group` of them a step: N, or 1 with split_batches)."""

    def __init__(self, site: tuple[str, int], world: int, group: int, drop_last: bool, census: LoaderCensus,
                 on_training: Callable[[DispatchedStream], None]) -> None:
        super().__init__(site, False, census, on_training)
        self.world = world
        self.group = group
        self.drop_last = drop_last

    def steps(self, batches: Iterable):
        """The reference's batches of one pass over the loader, whose own batches are `batches`."""
        return dispatched_steps(batches, self.world, self.group, self.drop_last) if self._is_training() else batches

    def length(self, batches: int) -> int:
        """The reference's batches in a pass, the loader's own being `batches` (DataLoaderDispatcher's length)."""
        if not self._is_training():
            return batches
        return batches // self.group if self.drop_last else math.ceil(batches / self.group)


def dispatched_steps(batches: Iterable, world: int, group: int, drop_last: bool) -> Iterator:
    """What Accelerate's DataLoaderDispatcher gives `world` ranks at each step, joined in rank order: `group`
    of the loader's `batches` concatenated (a short last group dropped with drop_last), every rank given
    the same share of its rows; without drop_last, a last step whose rows do not divide by `world` first gets
    the first step's first `world` rows added, so every rank gets one row more."""
    from accelerate.utils import concatenate, find_batch_size, slice_tensors

    batches = iter(batches)
    pending, first = list(islice(batches, group)), None
    while pending and (len(pending) == group or not drop_last):
        following = list(islice(batches, group))  # the dispatcher fetches a step ahead to know the last one
        last = not following or (drop_last and len(following) < group)
        step = concatenate(pending, dim=0)
        if first is None:
            first = slice_tensors(step, slice(0, world))
        rows = find_batch_size(step)
        share = rows // world
        if last and not drop_last and rows % world:
            step, share = concatenate([step, first], dim=0), share + 1
        yield slice_tensors(step, slice(0, world * share))
        pending = following


def _lines_running(path: str) -> set[int]:
    """The lines of file `path` that the stack is running (the loop iterating a loader, and its callers)."""
    lines, frame = set(), sys._getframe(1)
    while frame is not None:
        if os.path.realpath(frame.f_code.co_filename) == path:
            lines.add(frame.f_lineno)
        frame = frame.f_back
    return lines


def _call_site(known: Collection[tuple[str, int]]) -> tuple[str, int]:
    """(file, line) of the user code that constructed the DataLoader: the call of a project function
    that built it (`loader = get_training_dataloader(...)`) where static analysis knows that call
    (`known`), else the DataLoader call itself."""
    caller = sys._getframe(2)
    frame = caller
    while frame is not None:
        site = os.path.realpath(frame.f_code.co_filename), frame.f_lineno
        if site in known:
            return site
        frame = frame.f_back
    return os.path.realpath(caller.f_code.co_filename), caller.f_lineno


def _where(site: tuple[str, int]) -> str:
    return f"{os.path.basename(site[0])}:{site[1]}"


def _shuffles(arguments: dict) -> bool | None:
    """True/False for the samplers we can mirror, None for a custom sampler."""
    sampler = arguments.get("sampler")
    if sampler is None:
        return bool(arguments.get("shuffle"))
    if _draws_its_own(sampler):
        return None
    if isinstance(sampler, (RandomSampler, SequentialSampler)):
        return isinstance(sampler, RandomSampler)
    return None


def _drawn_alike(sampler) -> bool:
    """A sampler of the script's own that every process of an Accelerate candidate draws alike: one with a
    generator of its own (the prepared loader keeps it the same on every process), or one with no generator
    attribute at all (each process iterates its own copy); not a RandomSampler with replacement (see _draws_its_own)."""
    return not _draws_its_own(sampler) and not _seeded_at_prepare(sampler)


def _seeded_at_prepare(sampler) -> bool:
    """A sampler whose generator is None: Accelerate's prepare gives it one seeded from the global generator."""
    return getattr(sampler, "generator", True) is None


def _why_not_mirrored(sampler, accelerate: bool) -> str:
    """Why an Accelerate candidate's sampler with no generator yet cannot be mirrored ('' for any other)."""
    if accelerate and _seeded_at_prepare(sampler) and not _draws_its_own(sampler):
        return " (Accelerate gives its sampler a generator seeded from the global one when the loader is prepared)"
    return ""


def _draws_its_own(sampler) -> bool:
    """A RandomSampler with replacement (converted: each rank draws from a generator seeded with the rank):
    the ranks' draws are their own, so the reference cannot mirror them."""
    return isinstance(sampler, RandomSampler) and sampler.replacement


def align_training_loaders(world: int, batch_mode: str, static_sites: set[tuple[str, int]], recorder,
                           epoch_loops: dict[tuple[str, int], list[tuple[int, int, int]]] | None = None,
                           accelerate: bool = False) -> None:
    """Patch DataLoader construction so the reference's training loaders match `world` ranks.

    `batch_mode` is "per-gpu" (each rank keeps the script's batch) or "global" (the ranks
    split it); `static_sites` are the (realpath, line) of DataLoader calls known to train, and
    `epoch_loops` the epoch loops around each one (see LoaderCensus); `accelerate`: the candidate's
    loaders are Accelerate's (AcceleratedBatchSampler).
    `recorder` receives notes and flags (see recorder.Recorder).
    """
    census = LoaderCensus(static_sites, epoch_loops)
    register_optimizer_step_post_hook(lambda *_: setattr(census, "optimizer_stepped", True))
    original_init = DataLoader.__init__
    signature = inspect.signature(original_init)
    streams = dispatch_streams() if accelerate else None

    def aligned_init(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        site = _call_site(census.static_sites)
        if streams is not None and _dispatched(arguments):
            original_init(**arguments)
            streams[self] = _dispatched_stream(arguments, site, world, batch_mode, census, recorder)
            return
        sampler = _aligned_sampler(arguments, site, world, batch_mode, census, recorder, accelerate)
        if sampler is not None:
            for name in ("batch_size", "shuffle", "sampler", "drop_last"):
                arguments.pop(name, None)
            arguments["batch_sampler"] = sampler
        original_init(**arguments)

    DataLoader.__init__ = aligned_init


def dispatch_streams() -> weakref.WeakKeyDictionary:
    """Make the loaders entered in the returned map (DataLoader -> DispatchedStream) iterate, and count
    their length, as their DispatchedStream says."""
    streams: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    iterate, length = DataLoader.__iter__, DataLoader.__len__

    def dispatched_iter(self):
        stream = streams.get(self)
        return iterate(self) if stream is None else iter(stream.steps(iterate(self)))

    def dispatched_len(self):
        stream = streams.get(self)
        return length(self) if stream is None else stream.length(length(self))

    DataLoader.__iter__, DataLoader.__len__ = dispatched_iter, dispatched_len
    return streams


def _dispatched(arguments: dict) -> bool:
    """A batched loader over an IterableDataset, which a prepared loader dispatches from process 0."""
    return isinstance(arguments["dataset"], IterableDataset) and arguments.get("batch_size", 1) is not None


def _dispatched_stream(arguments: dict, site: tuple[str, int], world: int, batch_mode: str, census: LoaderCensus,
                       recorder) -> DispatchedStream:
    """The DispatchedStream of a loader over an IterableDataset (see dispatched_steps)."""
    batch_size = arguments.get("batch_size", 1)
    group = 1 if batch_mode == "global" else world
    census.known_training += site in census.static_sites

    def describe(stream: DispatchedStream) -> None:
        recorder.flag(RECUT_FLAG, f"{world} ranks x batch {batch_size * group // world} = {batch_size * group} samples "
                                  f"a step from the loader at {_where(site)}")
        recorder.note(f"training loader at {_where(site)} (an IterableDataset): reference step = {group} of its batches "
                      f"of {batch_size} joined, as Accelerate's prepared loader dispatches them from process 0 to "
                      f"{world} ranks")

    return DispatchedStream(site, world, group, bool(arguments.get("drop_last")), census, describe)


def _aligned_sampler(arguments: dict, site: tuple[str, int], world: int, batch_mode: str,
                     census: LoaderCensus, recorder, accelerate: bool) -> AlignedBatchSampler | None:
    """The batch sampler replacing this loader's batching, or None to leave the loader alone."""
    dataset = arguments["dataset"]
    batch_size = arguments.get("batch_size", 1)
    shuffle = _shuffles(arguments)
    own = arguments.get("sampler") if accelerate and shuffle is None and _drawn_alike(arguments.get("sampler")) else None
    if arguments.get("batch_sampler") is not None or batch_size is None or (shuffle is None and own is None) \
            or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        recorder.note(f"loader at {_where(site)} uses its own sampling, so the reference cannot mirror the ranks' samples"
                      f"{_why_not_mirrored(arguments.get('sampler'), accelerate)}")
        if _draws_its_own(arguments.get("sampler")):
            recorder.flag("training_randomness", f"a RandomSampler with replacement, loader at {_where(site)}")
        return None
    per_rank_batch = batch_size
    if batch_mode == "global":
        per_rank_batch = max(1, batch_size // world)
        if batch_size % world:
            recorder.flag("indivisible_batch", f"the global batch {batch_size} (loader at {_where(site)}) "
                                               f"is not divisible by {world} ranks")
    census.known_training += shuffle or site in census.static_sites

    def describe(sampler: AlignedBatchSampler) -> None:
        recorder.flag(RECUT_FLAG, f"{world} ranks x batch {per_rank_batch} = {world * per_rank_batch} samples a step "
                                  f"from the loader at {_where(site)}")
        recorder.note(f"training loader at {_where(site)}: reference step = {world} ranks x batch {per_rank_batch}, {sampler.dealing()}")
        if accelerate:
            return
        if sampler.size % world:
            recorder.note(f"{sampler.size} samples are not divisible by {world} ranks: DistributedSampler "
                          f"repeats {world - sampler.size % world} of them each epoch (the reference too)")

    size = len(own) if own is not None else len(dataset)
    sampler_args = (site, size, batch_size, per_rank_batch, bool(arguments.get("drop_last")), bool(shuffle), world, census, describe)
    if own is not None:
        return AcceleratedOwnSampler(*sampler_args, split=batch_mode == "global", sampler=own)
    if accelerate:
        return AcceleratedBatchSampler(*sampler_args, split=batch_mode == "global")
    return AlignedBatchSampler(*sampler_args)
