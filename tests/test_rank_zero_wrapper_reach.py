"""Rank-0-only output that reaches the DDP wrapper where the converter used to miss it.

A print that rank 0 alone makes must not run the wrapper's forward: with a buffer the forward writes,
each forward broadcasts it from rank 0, a collective the other ranks never join (the job hangs). The
converter hands such output the plain model (`model.module`) where only rank-0 output runs the
code: a closure reading the model of the function it is defined in, `model.forward(x)`. Where every
rank runs that code too (`logits(x)` of the training step, `self.scores(x)` of a trainer, a function
that a printed `train_epoch()` calls), it keeps the wrapper, and every rank computes the print's
call first. Proven by `ddpify verify` (the conversion on 2 ranks against the original: equivalent,
every rank agreeing), bounded by its timeout; before, each hung.
"""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from ddpify.convert import convert_source
from helpers import run_ddpify

NET = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 2)
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x):
            self.seen += len(x)
            return self.fc(x)
    """)
DATA = "DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,))), batch_size=8, shuffle=True)"


def _training(script: str, forward: str, holder: str = "") -> str:
    """`script` with its `STEPS` line made one epoch's training steps through `forward` (`model(x)`),
    the loader and optimizer read off `holder` (`self.`), at that line's indentation."""
    steps = textwrap.dedent(f"""\
        for x, y in {holder}loader:
            {holder}optimizer.zero_grad()
            loss = nn.functional.cross_entropy({forward}, y)
            loss.backward()
            {holder}optimizer.step()
        """)
    return re.sub(r"^( *)STEPS\n", lambda line: textwrap.indent(steps, line.group(1)), script, flags=re.MULTILINE)


# A closure that reads `model` of main(), and the model's forward called by name: only prints run them.
CLOSURE = _training(NET + textwrap.dedent(f"""\


    def main():
        torch.manual_seed(0)
        loader = {DATA}
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def predict(x):
            return model(x).argmax(1).tolist()

        for epoch in range(2):
            STEPS
            print("epoch", epoch, "predictions", predict(torch.ones(4, 8)))
            print("forward", model.forward(torch.ones(4, 8)).shape)


    if __name__ == "__main__":
        main()
    """), "model(x)")

# A function that the training step calls too, and the prints (itself, and through another function).
EVERY_RANK = _training(NET + textwrap.dedent(f"""\


    def logits(x):
        return model(x)


    def report():
        return f"{{logits(torch.ones(4, 8)).shape[1]}} classes"


    torch.manual_seed(0)
    loader = {DATA}
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        STEPS
        print("epoch", epoch, "logits", logits(torch.ones(4, 8)).shape, report())
    """), "logits(x)")

# A function that an epoch of training, printed, calls too: every rank runs the epoch, so the function
# keeps the wrapper, and the other print's call of it runs on every rank too.
HOISTED_CALLER = _training(NET + textwrap.dedent(f"""\


    def predict(x):
        return model(x).argmax(1)


    def train_epoch():
        STEPS
        return predict(torch.ones(4, 8)).tolist()


    torch.manual_seed(0)
    loader = {DATA}
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        print("epoch", epoch, "trained", train_epoch())
        print("prediction", predict(torch.ones(4, 8)).tolist())
    """), "model(x)")

# A trainer's method that its training step calls too, and its print.
TRAINER = _training(NET + textwrap.dedent(f"""\


    class Trainer:
        def __init__(self, loader):
            self.model = Net()
            self.loader = loader
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

        def scores(self, x):
            return self.model(x)

        def fit(self, epochs):
            for epoch in range(epochs):
                STEPS
                print("epoch", epoch, "scores", self.scores(torch.ones(4, 8)).shape)


    torch.manual_seed(0)
    Trainer({DATA}).fit(2)
    """), "self.scores(x)", "self.")


def test_a_closure_and_a_forward_by_name_that_only_prints_run_call_the_plain_model():
    result = convert_source(CLOSURE, "ddp")
    assert not result.missing, result.missing
    assert "        return model.module(x).argmax(1).tolist()\n" in result.output
    assert 'print("forward", model.module.forward(torch.ones(4, 8)).shape)' in result.output
    assert "loss = nn.functional.cross_entropy(model(x), y)" in result.output


def test_functions_training_calls_too_run_on_every_rank_before_the_print():
    result = convert_source(EVERY_RANK, "ddp")
    assert not result.missing, result.missing
    assert "def logits(x):\n    return model(x)\n" in result.output
    assert "    logits_result = logits(torch.ones(4, 8))\n    report_result = report()\n    if RANK == 0:\n" in result.output
    hoisted = convert_source(HOISTED_CALLER, "ddp")
    assert not hoisted.missing, hoisted.missing
    assert "    predict_result = predict(torch.ones(4, 8))\n    if RANK == 0:\n" in hoisted.output
    trainer = convert_source(TRAINER, "ddp")
    assert not trainer.missing, trainer.missing
    assert "        return self.model(x)\n" in trainer.output
    assert "            scores_result = self.scores(torch.ones(4, 8))\n            if RANK == 0:\n" in trainer.output


def _verify(script: str, tmp_path: Path) -> dict:
    (tmp_path / "train.py").write_text(script)
    done = run_ddpify(["verify", "train.py", "--to", "ddp", "--steps", "4", "--json"], tmp_path, timeout=300)
    return json.loads(done.stdout)


def test_verify_finds_the_closure_script_equivalent_on_two_ranks(tmp_path: Path):
    result = _verify(CLOSURE, tmp_path)
    assert result["verdict"] == "equivalent", result["message"]


def test_verify_finds_the_every_rank_scripts_equivalent_on_two_ranks(tmp_path: Path):
    for name, script in (("functions", EVERY_RANK), ("hoisted", HOISTED_CALLER), ("trainer", TRAINER)):
        (tmp_path / name).mkdir()
        result = _verify(script, tmp_path / name)
        assert result["verdict"] == "equivalent", (name, result["message"])
