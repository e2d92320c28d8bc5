"""What a DDP or FSDP script does across ranks, read from its `Anatomy` by the lint rules and codemods.

One module a question, each importing only those above it:

- `names`: the torch.distributed vocabulary (collectives, FSDP entry points, samplers, seeding).
- `reaching`: assignments and the value that reaches a use; callers and returned values.
- `accelerate`: Hugging Face Accelerate's spellings: the variables holding the `Accelerator`, its
  rank values, collectives and main-process output, and the models and loaders `prepare` wraps.
- `ranks`: rank values, rank conditions (`if rank == 0:`, `is_main_process()`, early exits under
  them) and which code runs on every rank.
- `wrappers`: DDP and DataParallel wrappers, what they wrap, and the models' constructor calls.
- `fsdp`: `fully_shard` and legacy FSDP.
- `every_rank_work`: collectives and training that every rank must join, told apart from rank-0 output.
- `samplers`, `randomness`, `launch`: DistributedSamplers; seeding and random draws; environment
  writes, `--local_rank` arguments, the backend, GPU indices and per-node downloads.
- `seeding`: which global RNGs (torch's, numpy's, Python's) a script seeds, and what each unseeded one
  costs it: wrong results (FSDP shards, hand-averaged gradients, splits per rank) or reproducibility.

Every function takes an `Anatomy`; whole-script results are cached on it (`per_anatomy`), so rules
that ask the same question share one answer. Values are followed the way `Anatomy.roles` follows them,
but where the analysis is flow-insensitive, the DDP questions are not: `model` is the plain model
before `model = DDP(model)` and the wrapper after it, so `reaching_values` reads the assignment that
reaches the use.
"""
