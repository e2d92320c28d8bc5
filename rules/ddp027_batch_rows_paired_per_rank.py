"""DDP027: a loss term pairs the batch's rows with each other, which each rank computes on its own rows only."""

from __future__ import annotations

from ddpify.anatomy.batch_pairs import batch_pairs
from ddpify.lint import Finding, Invalid, Rule
from ddpify.rules._cases import ACCELERATE_HEAD
from ddpify.rules._ddp import DDP_AND_ACCELERATE


class BatchRowsPairedPerRank(Rule, code="DDP027", name="batch-rows-paired-per-rank", severity="warning"):
    """## What it does
    Flags a product in the loss of a multi-GPU script (DDP, FSDP, Accelerate) that pairs each row of
    the batch with each other row: a tensor from the batch times the transpose of one
    (`a @ b.t()`, `a @ b.T`, `torch.mm(a, b.transpose(0, 1))`, `a.mm(b.t())`), a distance matrix
    (`torch.cdist(a, b)`) or rows broadcast against rows (`x[:, None] - x[None]`,
    `F.cosine_similarity(x.unsqueeze(1), x.unsqueeze(0), dim=-1)`): an energy-based GAN's
    pull-away term, a contrastive (InfoNCE) loss's logits, a triplet or center loss mining the
    batch. Both sides must come from
    the batch (the loader's rows or a model's output for them) and reach the loss that is
    back-propagated, in the training code or a function of this file it calls. Not flagged: a
    side that is a parameter (`x @ self.weight.t()` is a layer), rows gathered from every rank
    first, and a model's own methods (attention's `q @ k.transpose(-2, -1)` pairs a sample's
    tokens, not the batch's rows).

    ## Why is this bad?
    Each rank computes the term on its own rows: it pairs them with each other only, never with
    another rank's rows. The ranks' mean of the term is not the whole batch's, and neither is the
    gradient DDP averages: training differs from one process on the same global batch (not just by
    noise), as if this term saw a batch WORLD_SIZE times smaller. `ddpify verify` compares such a
    conversion statistically and names the product.

    ## Example
    ```python
    for x, _ in loader:
        z = model(x)
        unit = z / z.norm(dim=1, keepdim=True)
        loss = (unit @ unit.t()).mean()
        loss.backward()
    ```

    ## Use instead
    ```python
    import torch.distributed.nn.functional as dist_nn

    for x, _ in loader:
        z = torch.cat(dist_nn.all_gather(model(x)))  # every rank's rows, gradients back to their rank
        unit = z / z.norm(dim=1, keepdim=True)
        loss = (unit @ unit.t()).mean()
        loss.backward()
    ```
    Or keep the pairs within each rank on purpose, and say so with `# ddpify: ignore[DDP027]`.

    ## Fix safety
    No fix: whether to gather every rank's rows (one all-gather per step, and the term's gradient
    scaled as the script wants it) or to accept pairs within each rank is a choice about the
    training itself.
    """

    message = "this term pairs the batch's rows with each other: each rank pairs its own rows only, not the whole batch's"
    applies_to = DDP_AND_ACCELERATE

    def check(self, a):
        for pair in batch_pairs(a):
            yield Finding(a.pos(pair.node))


_HEAD = """import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 8))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
model = DDP(nn.Linear(4, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""
_STEP = "    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n"


def _loop(body: str, before: str = "") -> str:
    """The head (then `before`), then a training loop over its loader whose step first runs `body` (computing `loss`)."""
    return _HEAD + before + "for x, y in loader:\n    z = model(x)\n" + body + _STEP


def _case(body: str, product: str, before: str = "") -> Invalid:
    """`_loop`, reported on the line where `product` stands."""
    code = _loop(body, before)
    return Invalid(code, line=code.count("\n", 0, code.index(product)) + 1)


_ATTENTION = """

class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


attention = DDP(SelfAttention())
"""
_PULL_AWAY = """

def pull_away(embeddings):
    unit = embeddings / embeddings.norm(dim=1, keepdim=True)
    similarity = torch.matmul(unit, unit.transpose(1, 0))
    rows = embeddings.size(0)
    return (similarity.sum() - rows) / (rows * (rows - 1))


"""

BatchRowsPairedPerRank.VALID = (
    # attention pairs each sample's tokens (in the model's forward), not the batch's rows
    _loop("    loss = F.mse_loss(attention(z.unsqueeze(1)), y.unsqueeze(1))\n", before=_ATTENTION),
    # the last two dims swapped (attention's spelling in the training code): a sample's tokens by each other
    _loop("    tokens = z.view(8, 2, 4)\n    loss = (tokens @ tokens.transpose(-2, -1)).mean()\n"),
    # the rows by a parameter: a layer written by hand
    _loop("    loss = F.mse_loss(x @ model.module.weight.t(), y)\n"),
    # every rank's rows gathered first (autograd-aware): the pairs across ranks are kept
    _loop("    everyone = torch.cat(torch.distributed.nn.functional.all_gather(z))\n"
          "    loss = F.mse_loss(z, y) + (everyone @ everyone.t()).mean()\n"),
    # every rank's rows gathered into a list (the rank's own kept for its gradient), paired with this rank's
    _loop("    everyone = [torch.zeros_like(z) for _ in range(dist.get_world_size())]\n    dist.all_gather(everyone, z)\n"
          "    everyone[dist.get_rank()] = z\n    loss = F.cross_entropy(z @ torch.cat(everyone).t(), y.argmax(1))\n"),
    # the pairs feed a printed metric, not the loss
    _loop("    loss = F.mse_loss(z, y)\n    print((z @ z.t()).mean().item())\n"),
)
BatchRowsPairedPerRank.INVALID = (
    _case("    unit = z / z.norm(dim=1, keepdim=True)\n    loss = F.mse_loss(z, y) + (unit @ unit.t()).mean()\n", "unit @ unit.t()"),
    # an energy-based GAN's pull-away term, in a function of the script
    _case("    loss = F.mse_loss(z, y) + 0.1 * pull_away(z)\n", "torch.matmul(unit, unit.transpose(1, 0))", before=_PULL_AWAY),
    # contrastive logits of two views, by `.T`
    _case("    logits = z @ model(x + 0.1 * torch.randn_like(x)).T\n    loss = F.cross_entropy(logits, torch.arange(len(x)))\n",
          "z @ model(x + 0.1 * torch.randn_like(x)).T"),
    # a distance matrix, added with +=
    _case("    loss = F.mse_loss(z, y)\n    loss += torch.cdist(z, z).mean()\n", "torch.cdist(z, z)"),
    # rows broadcast against rows
    _case("    loss = (z[:, None] - z[None]).pow(2).mean()\n", "z[:, None] - z[None]"),
    _case("    loss = z.mm(z.t()).mean()\n", "z.mm(z.t())"),
    # SimCLR's similarities of every pair of rows
    _case("    similarity = F.cosine_similarity(z.unsqueeze(1), z.unsqueeze(0), dim=-1)\n    loss = similarity.mean()\n",
          "F.cosine_similarity(z.unsqueeze(1), z.unsqueeze(0), dim=-1)"),
    # Accelerate: the loader's rows of each process, paired in accelerator.backward's loss
    Invalid("from torch.utils.data import DataLoader, TensorDataset\n" + ACCELERATE_HEAD
            + "loader = accelerator.prepare(DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8))\n"
            + "for (x,) in loader:\n    z = model(x)\n    loss = (z @ z.T).mean()\n    accelerator.backward(loss)\n    optimizer.step()\n",
            line=ACCELERATE_HEAD.count("\n") + 5),
)
