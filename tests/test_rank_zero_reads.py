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
            print("epoch", epoch, describe(model))


    if __name__ == "__main__":
        main()
    """)


def test_a_function_a_rank_zero_print_hands_the_plain_model_reads_through_plain_model(tmp_path):
    output = convert_source(SCRIPT, "ddp").output
    assert "describe(model.module))" in output  # rank 0 alone calls the forward: the plain model
    assert "    return len(plain_model(net).vocab)\n" in output  # two calls deep, either model reads right
    script = tmp_path / "train_ddp.py"
    script.write_text(output)
    run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                     tmp_path, timeout=180)
    assert run.returncode == 0, failure_report(run)
    assert "epoch 1 2 words, 2 outputs" in run.stdout
