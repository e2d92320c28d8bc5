"""`ddpify verify`: run the original and the converted script side by side and compare them step by step.

Modules, from the command line down to the training process:

- runner: starts the launcher in its own process group (its torch import overlaps the
  conversion), converts the script if needed, hands the launcher the plan, and always
  kills that group at the end;
- launcher: imports torch once, forks the reference run and the candidate ranks
  (or starts the candidate under real torchrun), watches for failures and hangs,
  then compares the records;
- harness: installs the recording hooks inside one training process and runs the
  unmodified script with runpy;
- dataparallel: nn.DataParallel's replicas simulated in one process (scatter, replicate,
  gather) for a dp candidate on fewer than two GPUs;
- alignment: makes the reference's training DataLoaders see, step by step, the
  union of what the DistributedSampler ranks see;
- rendezvous: the TCPStore the launcher serves for the forked ranks, on a port held
  from the moment it is chosen;
- compare / diagnose / report: turn records, tracebacks and stack dumps into a verdict;
  plot draws its per-step rows (`--plot`, matplotlib).

Nothing is imported here, so `python -m ddpify.verify.harness` starts cheaply.
"""
