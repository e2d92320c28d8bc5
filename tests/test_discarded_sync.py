"""A backward whose gradients of a wrapped model are cleared unused runs under that model's no_sync() (issue 26).

A GAN's generator step back-propagates through the discriminator, whose `zero_grad()` in the next
pass clears those gradients before any use: the conversion runs that step's discriminator forward
through the backward under `netD.no_sync()` (ddpify.anatomy.discarded_gradients says where), and
nowhere it is unsure. The snippets run NoSyncDiscardedGradients alone (before/after); the whole
conversion is linted, and one script with such runs both ways is verified on two gloo ranks
(fixtures/real/shape_gan.py is verified by tests/test_ddp_shapes.py).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from ddpify.codemods.ddp import DDP_TRANSFORMS, NoSyncAccumulation, NoSyncDiscardedGradients
from ddpify.codemods.options import Options
from ddpify.codemods.pipeline import Status, run_pipeline
from ddpify.convert import convert_source
from ddpify.lint.engine import check_text, rule_set
from ddpify.lint.registry import all_rules

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import REPO_ROOT, run_ddpify  # noqa: E402

HEAD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 4)), batch_size=4, shuffle=True)
    netG = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
    netD = nn.Sequential(nn.Linear(8, 1))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-3)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-3)
    criterion = nn.BCEWithLogitsLoss()
"""

LOOP = "    for x, z in loader:\n"
D_STEP = """\
        ones = torch.ones(x.size(0), 1)
        optimizerD.zero_grad()
        lossD = criterion(netD(x), ones)
        lossD.backward()
        optimizerD.step()
"""
G_STEP = """\
        optimizerG.zero_grad()
        lossG = criterion(netD(netG(z)), ones)
        lossG.backward()
        optimizerG.step()
"""

# The DCGAN order: D's step, then G's, whose backward reaches netD; the next pass clears netD first.
GAN_LOOP = """\
    for epoch in range(2):
        for x, z in loader:
            ones, zeros = torch.ones(x.size(0), 1), torch.zeros(x.size(0), 1)
            optimizerD.zero_grad()
            fake = netG(z)
            lossD = criterion(netD(x), ones) + criterion(netD(fake.detach()), zeros)
            lossD.backward()
            optimizerD.step()

            optimizerG.zero_grad()
            lossG = criterion(netD(fake), ones)
            lossG.backward()
            optimizerG.step()
            print(f"epoch {epoch} lossD {lossD.item():.6f} lossG {lossG.item():.6f}")
"""

GAN_LOOP_AFTER = GAN_LOOP.replace("""\
            lossG = criterion(netD(fake), ones)
            lossG.backward()
""", """\
            # ddpify: optimizerD.zero_grad() clears netD's gradients from this backward unused: no_sync() saves their all-reduce, one a step
            with netD.no_sync():
                lossG = criterion(netD(fake), ones)
                lossG.backward()
""")


def converted(source: str) -> str:
    return run_pipeline(source, "snippet.py", [NoSyncDiscardedGradients], Options()).output


def test_the_transform_runs_after_accumulations_no_sync():
    assert DDP_TRANSFORMS.index(NoSyncDiscardedGradients) == DDP_TRANSFORMS.index(NoSyncAccumulation) + 1


def test_the_generator_steps_discriminator_forward_and_backward_run_under_its_no_sync():
    result = run_pipeline(HEAD + GAN_LOOP, "snippet.py", [NoSyncDiscardedGradients], Options())
    assert result.output == HEAD + GAN_LOOP_AFTER
    assert [(c.line, c.transform) for c in result.changes] == [(24, "no_sync_discarded")]


def test_netD_zero_grad_at_the_top_of_the_pass_clears_them_too():
    before = GAN_LOOP.replace("optimizerD.zero_grad()", "netD.zero_grad()")
    after = GAN_LOOP_AFTER.replace("optimizerD.zero_grad()", "netD.zero_grad()")
    assert converted(HEAD + before) == HEAD + after


def test_the_generator_step_first_is_cleared_by_the_discriminator_step_after_it():
    ones = "        ones = torch.ones(x.size(0), 1)\n"
    output = converted(HEAD + LOOP + ones + G_STEP + D_STEP.replace(ones, ""))
    assert "        with netD.no_sync():\n            lossG = criterion(netD(netG(z)), ones)\n            lossG.backward()\n" in output
    assert output.count("no_sync") == 2  # the comment and the with


def test_the_dcgan_reuse_of_a_name_the_discriminator_step_bound_is_not_a_graph_across():
    """`output = netD(real)` in D's step, then `output = netD(fake)` in G's: the name is bound again first."""
    loop = """\
    for x, z in loader:
        netD.zero_grad()
        output = netD(x)
        errD = criterion(output, torch.ones(x.size(0), 1))
        errD.backward()
        optimizerD.step()
        netG.zero_grad()
        output = netD(netG(z))
        errG = criterion(output, torch.ones(x.size(0), 1))
        errG.backward()
        optimizerG.step()
        print(output.mean().item())
"""
    assert "with netD.no_sync():\n            output = netD(netG(z))" in converted(HEAD + loop)


# ----- where nothing changes ---------------------------------------------------------------------
UNCHANGED = {
    "a single model": LOOP + D_STEP,
    "gradient accumulation": """\
    for i, (x, z) in enumerate(loader):
        loss = criterion(netD(x), torch.ones(x.size(0), 1)) / 4
        loss.backward()
        if (i + 1) % 4 == 0:
            optimizerD.step()
            optimizerD.zero_grad()
""",
    "D's step uses the gradients G's backward left, with no zero_grad between": LOOP + """\
        ones = torch.ones(x.size(0), 1)
        optimizerG.zero_grad()
        optimizerD.zero_grad()
        lossG = criterion(netD(netG(z)), ones)
        lossG.backward()
        lossD = criterion(netD(x), ones)
        lossD.backward()
        optimizerG.step()
        optimizerD.step()
""",
    "WGAN-GP's gradient penalty": LOOP + """\
        optimizerD.zero_grad()
        fake = netG(z).detach()
        mix = (0.5 * x + 0.5 * fake).requires_grad_(True)
        grad = torch.autograd.grad(netD(mix).sum(), mix, create_graph=True)[0]
        lossD = netD(fake).mean() - netD(x).mean() + ((grad.norm(2, dim=1) - 1) ** 2).mean()
        lossD.backward()
        optimizerD.step()
        optimizerG.zero_grad()
        lossG = -netD(netG(z)).mean()
        lossG.backward()
        optimizerG.step()
""",
    "D frozen with requires_grad_(False) for G's step": LOOP + "        netD.requires_grad_(True)\n" + D_STEP
    + "        netD.requires_grad_(False)\n" + G_STEP,
    "a gradient read after G's backward": LOOP + D_STEP + G_STEP.replace(
        "        optimizerG.step()\n", "        print(sum(p.grad.norm() for p in netD.parameters()))\n        optimizerG.step()\n"),
    "D clipped after the loop": LOOP + D_STEP + G_STEP + "    torch.nn.utils.clip_grad_norm_(netD.parameters(), 1.0)\n",
    "G's step under a condition (WGAN's n_critic)": "    for i, (x, z) in enumerate(loader):\n" + D_STEP
    + "        if i % 5 == 0:\n" + G_STEP.replace("        ", "            "),
    "D's output from its own step back-propagated in G's": LOOP + """\
        ones = torch.ones(x.size(0), 1)
        optimizerD.zero_grad()
        fake = netG(z)
        scores = netD(fake)
        lossD = criterion(netD(x), ones) + criterion(scores, 0 * ones)
        lossD.backward(retain_graph=True)
        optimizerD.step()
        optimizerG.zero_grad()
        lossG = criterion(netD(fake), ones) + scores.mean()
        lossG.backward()
        optimizerG.step()
""",
    "G's loss reads an output of D's forward from before D's backward": LOOP + "        scores = netD(netG(z))\n" + D_STEP
    + G_STEP.replace("lossG = criterion(", "lossG = criterion(scores, ones) + criterion("),
    "a forward in G's step that D's backward in the next pass reads": "    d_real = None\n" + LOOP + D_STEP.replace(
        "        lossD = criterion(netD(x), ones)\n        lossD.backward()\n",
        "        if d_real is not None:\n            criterion(d_real, ones).backward()\n",
    ) + G_STEP.replace("        lossG = ", "        d_real = netD(x)\n        lossG = "),
    "D handed to a helper that runs its forward": """\
    def adversarial(d, fake):
        return criterion(d(fake), torch.ones(fake.size(0), 1))

""" + LOOP + D_STEP + G_STEP.replace("lossG = criterion(", "lossG = adversarial(netD, netG(z)) + criterion("),
    "an optimizer over both models": "    both = torch.optim.SGD(list(netG.parameters()) + list(netD.parameters()), lr=0.1)\n"
    + LOOP + D_STEP + G_STEP,
}

# Each case above without what makes it unsure (the same text replaced): then the run is found.
SURE_WITHOUT = {
    "a gradient read after G's backward": ("print(sum(p.grad.norm() for p in netD.parameters()))", "pass"),
    "D clipped after the loop": ("torch.nn.utils.clip_grad_norm_(netD.parameters(), 1.0)", "pass"),
    "G's loss reads an output of D's forward from before D's backward": ("criterion(scores, ones) + ", ""),
    "a forward in G's step that D's backward in the next pass reads": ("criterion(d_real, ones).backward()", "print(d_real.mean().item())"),
    "D handed to a helper that runs its forward": ("adversarial(netD, netG(z)) + ", ""),
    "an optimizer over both models": ("both = torch.optim.SGD(list(netG.parameters()) + list(netD.parameters()), lr=0.1)", "pass"),
}


@pytest.mark.parametrize("case", SURE_WITHOUT)
def test_without_what_makes_it_unsure_the_run_is_found(case: str):
    old, new = SURE_WITHOUT[case]
    assert old in UNCHANGED[case]
    assert "with netD.no_sync():" in converted(HEAD + UNCHANGED[case].replace(old, new))


@pytest.mark.parametrize("loop", UNCHANGED.values(), ids=UNCHANGED.keys())
def test_nothing_changes_where_the_gradients_may_be_used_or_the_analysis_is_unsure(loop: str):
    source = HEAD + loop
    assert converted(source) == source


def test_a_batchnorm_discriminator_only_while_it_is_never_put_in_eval_mode():
    """The forward after one under no_sync() skips DDP's broadcast of rank 0's buffers: the other ranks'
    running statistics then differ until the next one, which only an eval-mode forward reads."""
    head = HEAD.replace("nn.Sequential(nn.Linear(8, 1))", "nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))")
    assert "with netD.no_sync():" in converted(head + GAN_LOOP)
    evaluated = head + GAN_LOOP + "    netD.eval()\n    print(netD(torch.randn(4, 8)))\n"
    assert converted(evaluated) == evaluated


# ----- the whole conversion ----------------------------------------------------------------------
GAN = HEAD + GAN_LOOP + """

if __name__ == "__main__":
    main()
"""


def test_the_whole_conversion_runs_the_generator_step_under_no_sync_and_lints_clean():
    result = convert_source(GAN, "ddp", path="gan.py")
    assert result.status is Status.CONVERTED, result.missing
    assert "            with netD.no_sync():\n                lossG = criterion(netD(fake), ones)\n" in result.output
    rules = rule_set(frozenset(r.code for r in all_rules() if r.default_enabled))
    findings, errors = check_text(result.output, "gan.py", rules)
    assert not errors
    assert [f"{f.pos.line}: {f.code} {f.message}" for f in findings] == []


# Each step's backward reaches the other model: D's step does not detach the fakes (G's gradients from it
# are cleared by optimizerG.zero_grad() before G's step), G's step runs through netD (cleared next pass).
BOTH_WAYS = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 4)), batch_size=8, shuffle=True)
    netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    netD = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3)
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3)
    criterion = nn.BCEWithLogitsLoss()
    for epoch in range(2):
        for step, (x, z) in enumerate(loader):
            ones, zeros = torch.ones(x.size(0), 1), torch.zeros(x.size(0), 1)
            fake = netG(z)
            lossD = criterion(netD(x), ones) + criterion(netD(fake), zeros)
            optimizerD.zero_grad()
            lossD.backward()
            optimizerD.step()
            fake = netG(z)
            lossG = criterion(netD(fake), ones)
            optimizerG.zero_grad()
            lossG.backward()
            optimizerG.step()
            print(f"epoch {epoch} step {step} lossD {lossD.item():.6f} lossG {lossG.item():.6f}")


if __name__ == "__main__":
    main()
"""


def test_runs_under_both_models_no_sync_verify_equivalent_on_two_ranks(tmp_path: Path):
    output = convert_source(BOTH_WAYS, "ddp", path="gan.py").output
    assert output.count(".no_sync():") == 2, output  # netG's in D's step, netD's in G's
    script = tmp_path / "gan.py"
    script.write_text(BOTH_WAYS)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    verdict = run_ddpify(["verify", str(script), "--to", "ddp", "--nproc", "2", "--json"], tmp_path, env, 240)
    report = json.loads(verdict.stdout)
    assert (verdict.returncode, report["verdict"]) == (0, "equivalent"), textwrap.shorten(str(report), 2000)
