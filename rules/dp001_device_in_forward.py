"""DP001: a device hard-coded inside the `forward` of a DataParallel-wrapped model."""

from __future__ import annotations

from ddpify.anatomy.forward import DeviceUse, hardcoded_devices, input_name
from ddpify.edits.expressions import cuda_to, parse_expr
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import expression_edit, statement_edit
from ddpify.rules._dp import HEAD, dp_replica_forwards


class DeviceInForward(Rule, code="DP001", name="device-in-forward", severity="error"):
    """## What it does
    Flags devices named inside the `forward` of a model wrapped in `nn.DataParallel` (and of the
    submodules it builds): `x.to("cuda:0")`, `.cuda()`, `torch.zeros(..., device="cuda")`,
    `device=DEVICE` for a module-level device constant, `self.device` set in `__init__`.

    ## Why is this bad?
    DataParallel runs `forward` once per GPU, each replica on its own slice of the batch and its own
    copy of the weights. A fixed device sends every replica's tensors to that one GPU: the replicas
    on the other GPUs fail with "Expected all tensors to be on the same device", or everything
    silently runs on GPU 0.

    ## Example
    ```python
    def forward(self, x):
        h = torch.zeros(x.size(0), self.hidden, device="cuda")
        return self.rnn(x.cuda(), h)
    ```

    ## Use instead
    ```python
    def forward(self, x):
        h = torch.zeros(x.size(0), self.hidden, device=x.device)
        return self.rnn(x, h)
    ```

    ## Fix safety
    The fix uses the device of forward's first argument (`<input>.device`), or drops
    `x = x.to(DEVICE)` on that argument (DataParallel already moved it). It is unsafe: the first
    argument might not be a tensor (a dict of inputs, a list), and then it has no `.device`.
    """

    message = "device hard-coded inside forward(): every DataParallel replica would use this one device"

    def check(self, a):
        for forward in dp_replica_forwards(a):
            source = input_name(forward)
            for use in hardcoded_devices(a, forward):
                target = use.stmt if use.kind == "redundant" else use.node
                fix = _follow_input(a, use, source) if source else None
                yield Finding(a.pos(target), fix=fix)


def _follow_input(a, use: DeviceUse, source: str) -> Fix | None:
    """The fix convert's ForwardDevices makes: drop the statement, or rewrite the expression with its builders."""
    device = f"{source}.device"
    if use.kind == "redundant":
        edit = statement_edit(a, use.stmt, lambda _: [])
        description = f"drop it: DataParallel already put {source} on the replica's GPU"
    elif use.kind == "cuda":
        edit = expression_edit(a, use.node, lambda call: cuda_to(call, device))
        description = f"move to {device}"
    else:
        edit = expression_edit(a, use.node, lambda _: parse_expr(device))
        description = f"use {device}"
    return Fix((edit,), safe=False, description=description) if edit else None


_DEVICE = 'DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
_NET = HEAD.replace("import torch\nfrom torch import nn\n", "import torch\nfrom torch import nn\n\n" + _DEVICE)
_WRAP = "model = nn.DataParallel(Net().to(DEVICE))\n"


def _forward(body: str) -> str:
    return _NET.replace("        return self.fc(x)\n", body) + _WRAP


def _fixed_case(body: str, line: int, fixed_body: str) -> Invalid:
    """A case whose forward has `body`, reported on `line`, and `fixed_body` once fixed."""
    return Invalid(_forward(body), line=line, fixed=_forward(fixed_body))


DeviceInForward.VALID = (
    _forward("        mask = torch.ones(4, device=x.device)\n        return self.fc(x * mask)\n"),
    _forward("        return self.fc(x.to(torch.float32).to('cpu'))\n"),
    # Net is not the model wrapped in DataParallel
    _forward("        return self.fc(x.cuda())\n").replace(_WRAP, "net = Net().to(DEVICE)\nother = nn.DataParallel(nn.Linear(2, 2))\n"),
)
DeviceInForward.INVALID = (
    _fixed_case(
        "        mask = torch.ones(4, device=DEVICE)\n        return self.fc(x * mask)\n",
        13,
        "        mask = torch.ones(4, device=x.device)\n        return self.fc(x * mask)\n",
    ),
    _fixed_case(
        "        x = x.to(DEVICE)\n        return self.fc(x)\n",
        13,
        "        return self.fc(x)\n",
    ),
    _fixed_case(
        "        bias = torch.zeros(2).cuda(non_blocking=True)\n        return self.fc(x) + bias\n",
        13,
        "        bias = torch.zeros(2).to(x.device, non_blocking=True)\n        return self.fc(x) + bias\n",
    ),
    _fixed_case(
        '        h = torch.zeros(2, device="cuda:0" if torch.cuda.is_available() else "cpu")\n        return self.fc(x) + h\n',
        13,
        "        h = torch.zeros(2, device=x.device)\n        return self.fc(x) + h\n",
    ),
    # the statement dropped shares its line: the statement after it stays, under the comment
    _fixed_case(
        "        # the batch\n        x = x.to(DEVICE); return self.fc(x)\n",
        14,
        "        # the batch\n        return self.fc(x)\n",
    ),
    _fixed_case(
        "        bias = (torch.zeros(2)).cuda()\n        return self.fc(x) + bias\n",
        13,
        "        bias = (torch.zeros(2)).to(x.device)\n        return self.fc(x) + bias\n",
    ),
)
