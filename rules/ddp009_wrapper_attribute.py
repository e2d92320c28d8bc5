"""DDP009: the model's own attributes read through the DDP wrapper."""

from __future__ import annotations

import ast

from ddpify.anatomy import ROLE_MODEL
from ddpify.anatomy.distributed.reaching import reaching_values
from ddpify.anatomy import syntax
from ddpify.anatomy.vocabulary import DDP_WRAPPER, TORCH_SAVE, wrapper_lacks
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import ACCELERATE_HEAD, NET
from ddpify.rules._ddp import DDP_AND_ACCELERATE, inner_model, is_ddp_wrapper, is_saved, module_fix, wraps_models


class WrapperAttribute(Rule, code="DDP009", name="wrapper-attribute", severity="error"):
    """## What it does
    Flags `model.<name>` where `model` is the `DistributedDataParallel` wrapper and `<name>` is
    not something `nn.Module` or DDP itself provides: the model's own methods (`model.generate()`,
    `model.encode(x)`), submodules (`model.fc`) and attributes (`model.num_classes`). It also flags
    `model.load_state_dict(...)` on the wrapper for a state dict that does not come from the wrapper.

    Methods every module has (`train`, `eval`, `parameters`, `zero_grad`, `to`, `named_parameters`,
    ...) and DDP's own (`no_sync`, `module`, `join`, ...) are fine on the wrapper.

    In a Hugging Face Accelerate script the wrapper is the model `accelerator.prepare` returned
    (DistributedDataParallel on several processes, the model itself on one: the bug shows only
    once launched on several), and its model is `accelerator.unwrap_model(model)`; not where the
    Accelerator is built with an FSDP, DeepSpeed, Megatron or ND-parallel option (their wrappers
    answer the model's attributes).

    ## Why is this bad?
    DDP stores the network as `self.module` and does not forward attribute lookups to it, so
    `model.encode` raises `AttributeError: 'DistributedDataParallel' object has no attribute
    'encode'` — typically at the first evaluation, long after training started. A state dict saved
    from the plain model has no `module.` prefix, so loading it into the wrapper fails with
    missing/unexpected keys.

    ## Example
    ```python
    model = DDP(Net().to(rank), device_ids=[rank])
    features = model.encode(x)
    model.load_state_dict(torch.load("net.pt"))
    ```

    ## Use instead
    ```python
    features = model.module.encode(x)
    model.module.load_state_dict(torch.load("net.pt", map_location=f"cuda:{rank}"))
    ```

    ## Fix safety
    Inserting `.module` (`accelerator.unwrap_model(...)` around a prepared model) before an
    attribute the wrapper lacks is safe (that line raised before).
    For `load_state_dict` it is unsafe: a checkpoint saved from another DDP wrapper has `module.`
    keys and loads into the wrapper as written.
    """

    message = "attribute of the model read through the DDP wrapper; use `.module`"
    applies_to = DDP_AND_ACCELERATE

    def check(self, a):
        if not wraps_models(a):
            return
        for node in a.nodes_of(ast.Attribute):
            if not isinstance(node.ctx, ast.Load):
                continue
            if node.attr == "load_state_dict":
                finding = _load_into_wrapper(a, node)
            elif not wrapper_lacks(DDP_WRAPPER, node.attr):
                continue
            else:
                finding = _missing_attribute(a, node)
            if finding is not None:
                yield finding


def _receiver_is_wrapper(a, node: ast.Attribute) -> bool:
    return isinstance(node.value, (ast.Name, ast.Attribute)) and a.has_role(node.value, ROLE_MODEL) and is_ddp_wrapper(a, node.value)


def _missing_attribute(a, node: ast.Attribute) -> Finding | None:
    if not _receiver_is_wrapper(a, node):
        return None
    inner = inner_model(a, node.value)
    fix = module_fix(a, node.value, safe=True, description=f"read `{node.attr}` from `{inner}`")
    return Finding(a.pos(node), f"the DDP wrapper has no attribute `{node.attr}` (AttributeError); use `{inner}.{node.attr}`", fix)


def _load_into_wrapper(a, node: ast.Attribute) -> Finding | None:
    call = a.parents.get(node)
    if not (isinstance(call, ast.Call) and call.func is node and call.args) or not _receiver_is_wrapper(a, node):
        return None
    if _comes_from_wrapper_state_dict(a, call.args[0]) or _saves_wrapper_state_dict(a):
        return None
    inner = inner_model(a, node.value)
    fix = module_fix(a, node.value, safe=False, description=f"load into `{inner}`")
    return Finding(a.pos(node), f"load_state_dict on the DDP wrapper expects `module.`-prefixed keys; load into `{inner}` instead", fix)


def _saves_wrapper_state_dict(a) -> bool:
    """Does the script save the wrapper's own `state_dict()` (keys prefixed `module.`, DDP008's)?
    Then its checkpoints load back into the wrapper as they are (Barlow Twins, VICReg resuming)."""
    return any(
        syntax.method_name(n) == "state_dict" and is_ddp_wrapper(a, n.func.value)  # type: ignore[attr-defined]
        and (is_saved(a, n) or _handed_to_a_saving_function(a, n))
        for n in a.nodes_of(ast.Call)
    )


def _handed_to_a_saving_function(a, node: ast.AST) -> bool:
    """`save_checkpoint({"state_dict": model.state_dict()}, ...)`, a function of this file that calls `torch.save`."""
    def saves(n: ast.AST) -> bool:
        return isinstance(n, ast.Call) and a.qualname(n.func) == TORCH_SAVE

    return any(isinstance(p, ast.Call) and (callee := a.callee(p)) is not None and a.function_contains(callee, saves)
               for p, _ in syntax.ancestors(a, node))


def _comes_from_wrapper_state_dict(a, expr: ast.AST) -> bool:
    values = [expr]
    for node in ast.walk(expr):
        if isinstance(node, ast.Name):
            values += reaching_values(a, node)
    return any(
        syntax.method_name(n) == "state_dict" and is_ddp_wrapper(a, n.func.value)  # type: ignore[attr-defined]
        for v in values for n in ast.walk(v)
    )


_HEAD = """import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


""" + NET + """

dist.init_process_group("gloo")
"""

WrapperAttribute.VALID = (
    ACCELERATE_HEAD + "z = accelerator.unwrap_model(model).predict(torch.ones(1, 4))\nmodel.train()\n",
    # prepare wraps in FSDP here, whose wrapper answers the model's attributes
    ACCELERATE_HEAD.replace("Accelerator()", "Accelerator(fsdp_plugin=plugin)") + "z = model.predict(torch.ones(1, 4))\n",
    # read before prepare wraps it
    ACCELERATE_HEAD.replace("model, optimizer = accelerator.prepare", "z = model.predict(torch.ones(1, 4))\nmodel, optimizer = accelerator.prepare"),
    # a method called from __init__ before the wrap still sees the plain network
    _HEAD + """class Trainer:
    def __init__(self):
        self.model = Net()
        self._restore()
        self.model = DDP(self.model)

    def _restore(self):
        self.model.load_state_dict(torch.load("net.pt", map_location="cpu"))
""",
    _HEAD + "model = DDP(Net())\nmodel.train()\nparams = list(model.parameters())\nz = model.module.predict(torch.ones(1, 4))\n",
    # before wrapping, `model` is the plain network
    _HEAD + "model = Net()\nz = model.predict(torch.ones(1, 4))\nmodel = DDP(model)\n",
    _HEAD + "model = DDP(Net())\nwith model.no_sync():\n    model(torch.ones(1, 4)).sum().backward()\n",
    _HEAD + "model = DDP(Net())\nmodel.module.load_state_dict(torch.load('net.pt', map_location='cpu'))\n",
    # the wrap and the read in different branches of one `if` (pytorch/examples imagenet: DDP, else DataParallel of the features)
    _HEAD + """
def build(distributed):
    model = Net()
    if distributed:
        model = DDP(model)
    else:
        model.fc = torch.nn.DataParallel(model.fc)
        model.load_state_dict(torch.load("net.pt", map_location="cpu"))
    return model
""",
    # a checkpoint the script saves from the wrapper itself loads back into the wrapper (Barlow Twins' resume)
    _HEAD + """model = DDP(Net())
ckpt = torch.load("ckpt.pt", map_location="cpu")
model.load_state_dict(ckpt["model"])
torch.save({"model": model.state_dict()}, "ckpt.pt")
""",
    # the same, saved through a function of the script's own (the ImageNet example's save_checkpoint)
    _HEAD + """

def save_checkpoint(state):
    torch.save(state, "ckpt.pt")


model = DDP(Net())
model.load_state_dict(torch.load("ckpt.pt", map_location="cpu")["state_dict"])
save_checkpoint({"state_dict": model.state_dict()})
""",
    # nanoGPT's unwrap idiom
    _HEAD + """distributed = dist.get_world_size() > 1
model = Net()
if distributed:
    model = DDP(model)
raw_model = model.module if distributed else model
z = raw_model.predict(torch.ones(1, 4))
""",
)
WrapperAttribute.INVALID = (
    Invalid.fixed_by(ACCELERATE_HEAD + "z = model.predict(torch.ones(1, 4))\n", old="model.predict",
                     new="accelerator.unwrap_model(model).predict"),
    Invalid.fixed_by(ACCELERATE_HEAD + "model.load_state_dict(torch.load('net.pt', map_location='cpu'))\n",
                     old="model.load_state_dict", new="accelerator.unwrap_model(model).load_state_dict"),
    Invalid.fixed_by(_HEAD + "model = DDP(Net())\nz = model.predict(torch.ones(1, 4))\n", old="model.predict", new="model.module.predict"),
    Invalid.fixed_by(
        _HEAD + """

def evaluate(net, x):
    return net.fc(x)


evaluate(DDP(Net()), torch.ones(1, 4))
""",
        old="net.fc", new="net.module.fc",
    ),
    Invalid.fixed_by(
        _HEAD + "model = DDP(Net())\nmodel.load_state_dict(torch.load('net.pt', map_location='cpu'))\n",
        old="model.load_state_dict", new="model.module.load_state_dict",
    ),
)
