"""A function that reads the model's own attributes, called from a print that rank 0 alone makes.

Rank-0-only code hands a local function the model inside the wrapper (`describe(model.module)`: the
wrapper's forward would sync with ranks that never call it), while the function was written for the
wrapper (`model.vocab` -> `.module.vocab`): the read goes through `plain_model(model)`, which is right
for either. Proven by running the conversion on 2 ranks.
"""

from __future__ import annotations

import sys
import textwrap

from ddpify.convert import convert_source
from helpers import failure_report, run_script

# Two epochs of training a Net, as a block's body.
TRAINING = textwrap.indent(textwrap.dedent("""\
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,))), batch_size=8, shuffle=True)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
    """), "    ")

SCRIPT = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 2)
            self.vocab = ["a", "b"]

        def forward(self, x):
            return self.fc(x)


    def words(net):
        return len(net.vocab)


    def describe(model):
        return f"{words(model)} words, {model(torch.zeros(1, 8)).shape[1]} outputs"


    def main():
    """) + TRAINING + textwrap.dedent("""\
            print("epoch", epoch, describe(model))


    if __name__ == "__main__":
        main()
    """)


def test_a_function_a_rank_zero_print_hands_the_plain_model_reads_through_plain_model(tmp_path):
    output, stdout = _converted_runs(SCRIPT, tmp_path)
    assert "describe(model.module))" in output  # rank 0 alone calls the forward: the plain model
    assert "    return len(plain_model(net).vocab)\n" in output  # two calls deep, either model reads right
    assert "epoch 1 2 words, 2 outputs" in stdout


# A function the rank-0 prints call, which calls the model it finds as a global (or in the `__main__`
# block, as graykode/nlp-tutorial's Seq2Seq `translate` does), not one handed to it. The model has a
# buffer: each forward of the wrapper broadcasts it from rank 0, which the other ranks never join.
RANK_ZERO_MODULE = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 2)
            self.register_buffer("scale", torch.ones(2))

        def forward(self, x):
            return self.fc(x) * self.scale


    def predict(x):
        return model(x).argmax(1).tolist()


    def outputs_of(net):
        return net(torch.zeros(1, 8)).shape[1]


    def report():
        return f"{len(predict(torch.ones(3, 8)))} predictions of {outputs_of(model)} classes"


    if __name__ == "__main__":
    """) + TRAINING + textwrap.indent(textwrap.dedent("""\

    def translate(x):
        with torch.no_grad():
            return len(predict(x) + model(x).argmax(1).tolist())

    print("report:", report())
    print("translated:", translate(torch.ones(2, 8)))
    """), "    ")

# A function that training calls too, and a print: its forward stays the wrapper's, whose gradients are
# averaged, so every rank computes the print's call (tests/test_rank_zero_wrapper_reach.py runs such scripts).
TRAINING_AND_PRINT = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def logits(x):
        return model(x)


    if __name__ == "__main__":
        loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,))), batch_size=8, shuffle=True)
        model = nn.Linear(8, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(logits(x), y)
            loss.backward()
            optimizer.step()
        print(logits(x).shape)
    """)

# A function the rank-0 prints call, whose global model is the wrapper at one print and the plain model
# reloaded after training at the other.
RELOADED = textwrap.dedent("""\
    import torch
    import torch.nn as nn


    def sample():
        return model(torch.ones(1, 2)).shape


    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in [torch.ones(4, 2)]:
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(sample())
    torch.save(model, "full.pt")
    model = torch.load("full.pt", weights_only=False)
    print(sample())
    """)


def _converted_runs(script: str, tmp_path) -> tuple[str, str]:
    """The conversion of `script`, lint-clean, and its stdout on 2 ranks."""
    result = convert_source(script, "ddp")
    assert not result.missing, result.missing
    path = tmp_path / "train_ddp.py"
    path.write_text(result.output)
    run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(path)],
                     tmp_path, timeout=180)
    assert run.returncode == 0, failure_report(run)
    return result.output, run.stdout


def test_functions_only_rank_zero_prints_call_run_the_plain_global_model(tmp_path):
    output, stdout = _converted_runs(RANK_ZERO_MODULE, tmp_path)
    assert "    return model.module(x).argmax(1).tolist()\n" in output  # called by rank-0-only functions alone
    assert "{outputs_of(model.module)} classes" in output  # handed on by one of them
    assert "    return net(torch.zeros(1, 8)).shape[1]\n" in output  # already the plain model
    assert "return len(predict(x) + model.module(x).argmax(1).tolist())" in output  # defined in the __main__ block
    assert "loss = nn.functional.cross_entropy(model(x), y)" in output
    assert "report: 3 predictions of 2 classes\ntranslated: 4\n" in stdout


def test_a_function_training_calls_too_keeps_the_wrapper_and_every_rank_runs_the_print_s_call():
    output = convert_source(TRAINING_AND_PRINT, "ddp").output
    assert "def logits(x):\n    return model(x)\n" in output
    assert "        logits_result = logits(x)\n        if RANK == 0:\n            print(logits_result.shape)\n" in output


def test_a_function_whose_global_model_is_plain_on_some_paths_is_left_to_the_user():
    result = convert_source(RELOADED, "ddp")
    assert "    return model(torch.ones(1, 2)).shape\n" in result.output  # .module would fail on the reloaded model
    assert [m.what.split(" (")[0] for m in result.missing] == ["ddpify lint still finds DDP002"]
