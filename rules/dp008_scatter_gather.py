"""DP008: a DataParallel call whose argument would be split along the wrong dimension, or whose output cannot be gathered."""

from __future__ import annotations

from ddpify.anatomy.forward_losses import model_calls
from ddpify.anatomy.scatter_gather import scatter_misuses, misuse_text
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._dp import is_dp_wrapper


class ScatterGather(Rule, code="DP008", name="scatter-gather", severity="error"):
    """## What it does
    Flags a call of an `nn.DataParallel`-wrapped model that passes a recurrent layer's hidden state
    (`(layers, batch, hidden)`), or a sequence-first input of a layer without `batch_first=True`,
    and a call whose `forward` returns the output of `pad_packed_sequence` without `total_length=`.
    A state that only ever comes out of an earlier call of the wrapper is not flagged.

    ## Why is this bad?
    DataParallel splits every tensor argument along dim 0 and joins the replicas' outputs along
    dim 0. A hidden state split along dim 0 gives each GPU some of the layers of the whole batch:
    the layer fails on its size, or computes on the wrong samples. `pad_packed_sequence` pads each
    replica's output to the longest sequence of its own part of the batch, so the outputs differ in
    length and cannot be joined. On CPU, or with one GPU, DataParallel just calls the model and the
    script works.

    ## Example
    ```python
    model = nn.DataParallel(CharRNN())
    h = torch.zeros(layers, batch, hidden)
    out, h = model(x, h)
    ```

    ## Use instead
    ```python
    def forward(self, x, h):  # h batch-first: (batch, layers, hidden)
        out, h = self.rnn(x, h.transpose(0, 1).contiguous())
        return out, h.transpose(0, 1)
    ```

    ## Fix safety
    No fix: where the batch dimension goes depends on the model.
    """

    message = "DataParallel splits this call's tensors along dim 0 and joins its outputs along dim 0, which this argument or output does not allow"

    def check(self, a):
        def wraps(call) -> bool:
            return is_dp_wrapper(a, call.func)

        for call, classes in model_calls(a):
            for misuse in scatter_misuses(a, call, classes, wraps) if wraps(call) else ():
                yield Finding(a.pos(misuse.given if misuse.given is not None else call), message=misuse_text(call, misuse))


_HEAD = """import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 8, 2, batch_first=True)

    def forward(self, x, h=None, lengths=None):
{body}


model = nn.DataParallel(Net())
x = torch.randn(8, 5, 4)
"""
_STATE = _HEAD.format(body="        out, h = self.rnn(x, h)\n        return out, h")
_PADDED = _HEAD.format(body="        out, _ = self.rnn(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))\n"
                            "        return pad_packed_sequence(out, batch_first=True{total})[0]")

ScatterGather.VALID = (
    _STATE + "out, h = model(x)\nout, h = model(x, h)\n",  # the state only ever comes out of the wrapper
    _STATE + "out, h = model.module(x, torch.zeros(2, 8, 8))\n",  # the model itself, not the wrapper
    _PADDED.format(total=", total_length=5") + "out = model(x, lengths=torch.full((8,), 5))\n",
)
ScatterGather.INVALID = (
    Invalid(_STATE + "out, h = model(x, torch.zeros(2, 8, 8))\n", line=18),
    Invalid(_PADDED.format(total="") + "out = model(x, lengths=torch.full((8,), 5))\n", line=18),
)
