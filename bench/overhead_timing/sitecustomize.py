"""Per-batch timestamps for bench/bench_overhead.py, the same in a converted script and an expert port.

Active only where DDPIFY_BENCH_TIMES names a folder (bench_overhead.py puts this folder on
PYTHONPATH for its launches). Every `next()` on a DataLoader iterator records the wall time, the
process's CPU time (its threads', gloo's included) and how many backward passes had run; at exit each process that iterated a loader writes its records, and its peak CUDA memory where it used
the GPU, to <folder>/times-<RANK>-<pid>.json. Nothing in the scripts is changed: the interval between two
`next()` calls on one iterator is the loop body of one batch, a training step when a backward ran
in it, an evaluation step when none did. Where DDPIFY_BENCH_SHARE_GPU is set, every rank runs on
GPU 0 with gloo (ddpify.verify.harness.share_single_gpu, what `verify --device cuda` does).
"""
import os

_FOLDER = os.environ.get("DDPIFY_BENCH_TIMES")


def _install(folder: str) -> None:
    import atexit
    import itertools
    import json
    import time

    import torch
    from torch.utils.data import dataloader

    records: list[tuple[int, float, float, int]] = []  # (pass, wall time, process CPU time, backwards so far)
    backwards = [0]
    passes = itertools.count()
    next_batch = dataloader._BaseDataLoaderIter.__next__
    backward = torch.Tensor.backward

    def timed_next(self):
        if not hasattr(self, "_bench_pass"):  # numbered, not id(): a later iterator may reuse a freed one's id
            self._bench_pass = next(passes)
        records.append((self._bench_pass, time.perf_counter(), time.process_time(), backwards[0]))
        return next_batch(self)

    def counted_backward(self, *args, **kwargs):
        backwards[0] += 1
        return backward(self, *args, **kwargs)

    def dump() -> None:
        if records:
            peak = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else None
            name = f"times-{os.environ.get('RANK', 'main')}-{os.getpid()}.json"
            with open(os.path.join(folder, name), "w") as out:
                json.dump({"records": records, "cuda_peak_bytes": peak}, out)

    dataloader._BaseDataLoaderIter.__next__ = timed_next
    torch.Tensor.backward = counted_backward
    atexit.register(dump)


if _FOLDER:
    _install(_FOLDER)
if os.environ.get("DDPIFY_BENCH_SHARE_GPU"):
    from ddpify.verify.harness import share_single_gpu

    share_single_gpu()
