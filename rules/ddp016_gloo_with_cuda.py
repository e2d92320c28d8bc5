"""DDP016: the gloo backend in a script that trains on CUDA."""

from __future__ import annotations

import ast

from ddpify.anatomy.distributed.launch import backends
from ddpify.anatomy.distributed.ranks import conditions_on
from ddpify.anatomy import syntax
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import expression_edit, string_like

_CUDA_SETUP = frozenset({"torch.cuda.set_device", "torch.cuda.device"})
_CUDA_CHECKS = frozenset({"torch.cuda.is_available", "torch.cuda.device_count"})


class GlooWithCuda(Rule, code="DDP016", name="gloo-with-cuda", severity="warning"):
    """## What it does
    Flags `init_process_group("gloo")` (or `backend="gloo"`) in a script that puts its work on the
    GPU: it calls `.cuda()`, `torch.cuda.set_device(...)`, or moves things to a `"cuda..."` device.

    ## Why is this bad?
    Gloo is the CPU backend. It can all-reduce CUDA tensors, but by copying them through host
    memory, so DDP's gradient all-reduce is many times slower than with NCCL, and several
    collectives (`reduce_scatter`, `all_to_all`, ...) are not supported for CUDA tensors with gloo
    at all. Scripts usually get here by copying a CPU example; a backend chosen by a CUDA check
    (`"nccl" if torch.cuda.is_available() else "gloo"`, or gloo in the branch without CUDA) is not
    reported.

    ## Example
    ```python
    dist.init_process_group("gloo")
    model = DDP(Net().cuda(local_rank), device_ids=[local_rank])
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    ```

    ## Fix safety
    Unsafe: NCCL needs CUDA (it fails on CPU-only machines and on Windows), and collectives on CPU
    tensors the script may also run then fail.
    """

    message = "gloo backend while training on CUDA: use NCCL for GPU tensors"

    def check(self, a):
        gloo = [
            (site, backend) for site, backend in backends(a)
            if syntax.constant(backend, "gloo") and not _depends_on_cuda(a, site.node)
        ]
        if not gloo or not _uses_cuda(a):
            return
        for site, backend in gloo:
            edit = expression_edit(a, backend, lambda literal: string_like(literal, "nccl"))
            yield Finding(site.pos, fix=Fix((edit,), safe=False, description="use the NCCL backend") if edit else None)


def _depends_on_cuda(a, node: ast.AST) -> bool:
    """Is the call on a path chosen by a CUDA check (`if torch.cuda.is_available(): ... else: gloo`)?"""
    return any(
        any(a.qualname(n.func) in _CUDA_CHECKS for n in ast.walk(test) if isinstance(n, ast.Call))
        for test in conditions_on(a, node)
    )


def _uses_cuda(a) -> bool:
    for site in a.calls:
        call = site.node
        if site.qualname in _CUDA_SETUP or syntax.method_name(call) == "cuda":
            return True
        places = syntax.method_name(call) == "to" or site.qualname == "torch.device"
        if places and any(_names_cuda(arg) for arg in call.args):  # type: ignore[attr-defined]
            return True
    return any(kw.arg == "device" and _names_cuda(kw.value) for c in a.calls for kw in c.node.keywords)  # type: ignore[attr-defined]


def _names_cuda(expr: ast.AST) -> bool:
    """A literal or f-string starting with "cuda" anywhere inside `expr`."""
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cuda"):
            return True
    return False


_HEAD = "import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"

GlooWithCuda.VALID = (
    _HEAD + """

def setup(local_rank):
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return torch.device("cpu")
""",
    _HEAD + "dist.init_process_group('gloo')\nmodel = DDP(torch.nn.Linear(4, 1))\n",
    _HEAD + "dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')\n"
    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\nmodel = DDP(torch.nn.Linear(4, 1).to(device))\n",
)
GlooWithCuda.INVALID = (
    Invalid.fixed_by(
        _HEAD + "dist.init_process_group(backend='gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(4, 1).to(f'cuda:{rank}'))\n",
        old="'gloo'", new="'nccl'",
    ),
    # no "gloo" in the text to replace: the fix writes the literal anew
    Invalid.fixed_by(_HEAD + "dist.init_process_group(r'gl' 'oo')\nmodel = DDP(torch.nn.Linear(4, 1).cuda())\n", old="'gl' 'oo'", new="'nccl'"),
)
