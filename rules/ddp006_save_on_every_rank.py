"""DDP006: checkpoints and files written by every rank."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.ranks import is_rank_test, rank_guarded, runs_on_every_rank
from ddpify.anatomy.distributed.reaching import callers
from ddpify.anatomy import syntax
from ddpify.anatomy.distributed.launch import download_of, one_rank_goes_first
from ddpify.anatomy.output import FILE_OUTPUT, FILE_REMOVED, output_kind
from ddpify.anatomy.vocabulary import OPEN_CALLS, TORCH_SAVE, opens_for_writing
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import ACCELERATE_HEAD, ON_MAIN_PROCESS, guarded_case
from ddpify.rules._ddp import DDP_AND_ACCELERATE, per_rank_target, rank_zero_guard_fix

class SaveOnEveryRank(Rule, code="DDP006", name="save-on-every-rank", severity="error"):
    """## What it does
    Flags `torch.save(...)`, `open(..., "w")` and the other file writers (`numpy.save(...)`,
    `pickle.dump(...)`, `.savefig(...)`, `.save_pretrained(...)`, ...), and the calls that remove or move
    a file (`os.remove(...)`, `shutil.rmtree(...)`, `os.replace(...)`, `path.unlink()`), that run on every rank: not
    under a rank-0 test, not after an early return of the other ranks, and not in a function only
    called from such places. A write in a function of the script's own that some calls run on rank
    0 only is reported at its other calls, the ones to guard (naming the write's line). Writes to a path that contains the rank
    (`f"ckpt_{rank}.pt"`) are per-rank on purpose and not reported.

    A download's own writes (`with urlopen(url) as r, open(path, "wb") as f:`, an archive extracted, with
    the `if` that skips them where the files exist) are a node's duty, not rank 0's: they are reported
    when every rank downloads at once, and not when one rank goes first while the others wait (`if
    local_rank != 0: dist.barrier()` right before the download). `ddpify convert --to ddp` lets rank 0
    go first, then each other node's local rank 0, then the rest: one download on a shared filesystem,
    one per node where each has a disk of its own. Under `if rank == 0:` alone, a node with a disk of
    its own would find no files.

    Hugging Face Accelerate scripts are checked too: there `accelerator.save(obj, path)`,
    `accelerator.save_model(model, dir)`, `accelerator.save_state(dir)` and
    `save_pretrained(dir, is_main_process=accelerator.is_main_process)` are fine on every process
    (they write on the main process only); a plain `torch.save` is not.

    ## Why is this bad?
    All ranks write the same file at the same time. The writes race: on a shared filesystem the
    file can end up truncated or interleaved, and a later `torch.load` fails or loads garbage. It
    also multiplies I/O by the world size. After DDP's gradient averaging every rank holds the same
    weights, so rank 0's copy is the checkpoint. A file removed (an older checkpoint deleted) by every
    rank at once is found gone by all but the first: the others crash with `FileNotFoundError`.

    ## Example
    ```python
    torch.save(model.module.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "model.pt")
    dist.barrier()  # if other ranks read the file next
    ```

    ## Fix safety
    Unsafe: wraps the statement (a `torch.save(...)` statement or a whole `with open(...)` block) in
    `if <rank-0 test>:`, reusing the script's own rank-0 test when the function already has one,
    else `accelerator.is_main_process` in an Accelerate script, else `dist.get_rank() == 0`. Other ranks that read the file afterwards now need a barrier,
    which the fix does not add. A download has no fix: `ddpify convert --to ddp` puts the barriers around it.
    """

    message = "every rank writes this file at once; the writes race — write on rank 0 only"
    download_message = ("every rank downloads into the same files at once; the writes race — download on rank 0 first, then on "
                        "each other node's local rank 0, the other ranks waiting at barriers (rank 0 alone would leave a node "
                        "with a disk of its own without the files)")
    removal_message = "every rank removes (or moves) this file at once; all but the first find it gone — do it on rank 0 only"
    applies_to = DDP_AND_ACCELERATE

    def check(self, a):
        reported: set[ast.AST] = set()
        for site in a.calls:
            call: ast.Call = site.node  # type: ignore[assignment]
            if not _writes_file(a, site) or _per_rank_file(a, _path(a, site)) or not runs_on_every_rank(a, call):
                continue
            download = download_of(a, call)
            if download is not None:  # a node's duty: one rank of each node first, not rank 0 alone
                if download not in reported and not one_rank_goes_first(a, download):
                    reported.add(download)
                    yield Finding(site.pos, self.download_message)
                continue
            unguarded = _unguarded_calls_of_a_guarded_function(a, site)
            if not unguarded:
                yield Finding(site.pos, self.removal_message if _removes_file(a, site) else None, _fix(a, site))
            for caller in [c for c in unguarded if c not in reported]:  # where a reader fixes it: the call the others guard
                reported.add(caller)
                yield Finding(a.pos(caller), f"every rank calls {site.scope}() here, which writes a file at line {site.line} "
                                             "(its other calls run on rank 0 only); the writes race — call it on rank 0 only",
                              _fix_call(a, caller))


def _unguarded_calls_of_a_guarded_function(a, site) -> list[ast.Call]:
    """The write's function is called under a rank-0 test somewhere: its calls that run on every rank."""
    calls = callers(a, site.scope)
    if not any(rank_guarded(a, c) for c in calls):
        return []
    return [c for c in calls if runs_on_every_rank(a, c)]


def _fix_call(a, call: ast.Call):
    stmt = a.stmt_of[call]
    return rank_zero_guard_fix(a, stmt, may_be_safe=False) if isinstance(stmt, ast.Expr) and stmt.value is call else None


def _writes_file(a, site) -> bool:
    return output_kind(a, site.node) in FILE_OUTPUT or opens_for_writing(a, site.node)


def _removes_file(a, site) -> bool:
    return output_kind(a, site.node) == FILE_REMOVED


def _per_rank_file(a, path: ast.AST | None) -> bool:
    """A path named after the rank, or chosen by a rank test (`path if accelerator.is_main_process else os.devnull`)."""
    return per_rank_target(a, path) or (isinstance(path, ast.IfExp) and is_rank_test(a, path.test))


def _path(a, site) -> ast.AST | None:
    """The file (or directory) argument: `torch.save(obj, f)`, `open(file)`, `np.save(file, arr)`, `.save_pretrained(dir)`."""
    if site.qualname == TORCH_SAVE:
        return syntax.argument(site.node, 1, "f")
    return syntax.argument(site.node, 0, "file") or syntax.argument(site.node, 0, "save_directory")


def _fix(a, site):
    stmt = site.stmt
    wraps_whole_write = (isinstance(stmt, ast.Expr) and stmt.value is site.node) or (
        isinstance(stmt, ast.With) and site.qualname in OPEN_CALLS
    )
    return rank_zero_guard_fix(a, stmt, may_be_safe=False) if wraps_whole_write else None


_HEAD = """import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
"""

_DOWNLOAD = "import os\nimport urllib.request\n" + _HEAD + "url = 'https://example.org/rows.txt'\n"
_FETCH = "if not os.path.exists('rows.txt'):\n    with urllib.request.urlopen(url) as r, open('rows.txt', 'wb') as f:\n        f.write(r.read())\n"

SaveOnEveryRank.VALID = (
    # a download: each node's local rank 0 first, the node's other ranks waiting
    _DOWNLOAD + "local_rank = int(os.environ['LOCAL_RANK'])\nif local_rank != 0:\n    dist.barrier()\n" + _FETCH
    + "if local_rank == 0:\n    dist.barrier()\n",
    # rank 0 first, then each other node's local rank 0, then the rest (what --to ddp writes)
    _DOWNLOAD + "local_rank = int(os.environ['LOCAL_RANK'])\nif rank != 0:\n    dist.barrier()\nif local_rank != 0:\n"
    "    dist.barrier()\n" + _FETCH + "if rank == 0:\n    dist.barrier()\nif local_rank == 0:\n    dist.barrier()\n",
    _HEAD + "if rank == 0:\n    torch.save(model.state_dict(), 'model.pt')\ndist.barrier()\n",
    _HEAD + "torch.save(model.state_dict(), f'model_rank{rank}.pt')\n",
    _HEAD + """

def save(path):
    with open(path, "w") as f:
        f.write("done")


if dist.get_rank() == 0:
    save("log.txt")
""",
    _HEAD + "with open('config.json') as f:\n    text = f.read()\n",
    # the ImageNet example's condition
    _HEAD + "ngpus_per_node = 8\nif rank % ngpus_per_node == 0:\n    torch.save(model.state_dict(), 'model.pt')\n",
    # Accelerate's own writes: on the main process only, called by every process
    ACCELERATE_HEAD + "accelerator.save(accelerator.unwrap_model(model).state_dict(), 'model.pt')\n"
    "accelerator.save_model(model, 'out')\naccelerator.save_state('ckpt')\n",
    ACCELERATE_HEAD + f"accelerator.unwrap_model(model).save_pretrained('out', is_main_process={ON_MAIN_PROCESS})\n",
    # the main process writes the file, the others os.devnull (--to accelerate's file opened around training)
    "import os\n" + ACCELERATE_HEAD + f"with open('log.txt' if {ON_MAIN_PROCESS} else os.devnull, 'w') as f:\n    f.write('done')\n",
    # an older checkpoint removed on rank 0 only, a per-rank scratch file by its own rank
    "import os\n" + _HEAD + "if rank == 0:\n    os.remove('epoch_1.pt')\nos.remove(f'scratch_{rank}.pt')\n",
)
SaveOnEveryRank.INVALID = (
    # every rank downloads at once (reported once, without a fix: rank 0 alone would leave the other nodes without it)
    Invalid(_DOWNLOAD + _FETCH, line=11),
    guarded_case(_HEAD, "torch.save(model.state_dict(), 'model.pt')\n"),
    guarded_case(ACCELERATE_HEAD, "torch.save(accelerator.unwrap_model(model).state_dict(), 'model.pt')\n", test=ON_MAIN_PROCESS),
    guarded_case(ACCELERATE_HEAD, "accelerator.unwrap_model(model).save_pretrained('out')\n", test=ON_MAIN_PROCESS),
    # no rank-0 test in the function to reuse
    guarded_case(
        _HEAD + "\n\ndef finish(net):\n",
        "    torch.save(net.state_dict(), 'model.pt')\n",
        test="dist.get_rank() == 0",
        after="\n\nfinish(model)\n",
    ),
    guarded_case(_HEAD + "if rank == 0:\n    print('saving')\n", "with open('log.txt', 'a') as f:\n    f.write('x')\n"),
    # every rank deletes the older checkpoints: all but the first find each gone
    guarded_case("import glob\nimport os\n" + _HEAD + "for old in glob.glob('*.pt'):\n", "    os.remove(old)\n"),
    # a function of the script's own whose other call is guarded: reported (and guarded) at the call on every rank
    Invalid(
        _HEAD + "\n\ndef save_checkpoint(state):\n    torch.save(state, 'ckpt.pt')\n\n\n"
        "if rank == 0:\n    save_checkpoint(model.state_dict())\nsave_checkpoint(model.state_dict())\n",
        line=15,
        fixed=_HEAD + "\n\ndef save_checkpoint(state):\n    torch.save(state, 'ckpt.pt')\n\n\n"
        "if rank == 0:\n    save_checkpoint(model.state_dict())\nif rank == 0:\n    save_checkpoint(model.state_dict())\n",
    ),
    # a multi-line string keeps its contents: only the code lines move in
    Invalid(
        _HEAD + 'with open("README.txt", "w") as f:\n    f.write(f"""model\n{model}\n""")\n',
        line=7,
        fixed=_HEAD + 'if rank == 0:\n    with open("README.txt", "w") as f:\n        f.write(f"""model\n{model}\n""")\n',
    ),
    # a one-line `if` is spread over two lines first, its comment kept
    Invalid(
        _HEAD + "if model.weight.sum() > 0: torch.save(model.state_dict(), 'best.pt')  # best so far\n",
        line=7,
        fixed=_HEAD + "if model.weight.sum() > 0:\n    if rank == 0:\n        torch.save(model.state_dict(), 'best.pt')  # best so far\n",
    ),
    # so is `a; b`
    Invalid(
        _HEAD + "model.eval(); torch.save(model.state_dict(), 'model.pt'); model.train()\n",
        line=7,
        fixed=_HEAD + "model.eval()\nif rank == 0:\n    torch.save(model.state_dict(), 'model.pt')\nmodel.train()\n",
    ),
)
