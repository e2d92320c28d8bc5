"""Each DataParallel transform on its own, before/after, in the style of LibCST's CodemodTest."""

from __future__ import annotations

import libcst as cst
from libcst.codemod import CodemodContext, CodemodTest

from ddpify.anatomy import analyze
from ddpify.codemods.options import Options
from ddpify.codemods.seeds import SeedWhereAskedFor
from ddpify.codemods.dp import (
    DP_TRANSFORMS,
    BatchSizeAdvice,
    DPModuleAccess,
    ForwardDevices,
    ForwardState,
    MeanLoss,
    ScatterGather,
    WrapDataParallel,
)

TRAIN = """
def main():
    model = {model}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=8):
        {step}
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def line_of(code: str, text: str) -> int:
    """The line of the fixture-normalised `code` that holds `text`."""
    lines = CodemodTest.make_fixture_data(code).splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


class TransformTest(CodemodTest):
    """`assertTransform(before, after)`: the transform sees the anatomy of `before`."""

    def assertTransform(self, before: str, after: str) -> None:
        anatomy = analyze(self.make_fixture_data(before))
        self.assertCodemod(before, after, anatomy, Options())

    def report(self, code: str):
        """What the transform reports on `code`."""
        code = self.make_fixture_data(code)
        transform = self.TRANSFORM(CodemodContext(), analyze(code), Options())
        transform.transform_module(cst.parse_module(code))
        return transform.report

    def advice(self, code: str) -> list[tuple[int, str]]:
        """(line, message) of the advice the transform gives on `code`."""
        return [(a.line, a.message) for a in self.report(code).advice]

    def missing(self, code: str) -> list[tuple[int, str]]:
        """(line, what) of what the transform could not do on `code` (the conversion is incomplete)."""
        return [(m.line, m.what) for m in self.report(code).missing]


def test_transforms_are_named_and_described():
    assert DP_TRANSFORMS == (SeedWhereAskedFor, ForwardDevices, WrapDataParallel, MeanLoss, DPModuleAccess, ForwardState, ScatterGather, BatchSizeAdvice)
    for transform in DP_TRANSFORMS:
        assert transform.NAME and transform.__doc__, transform


class TestForwardDevices(TransformTest):
    TRANSFORM = ForwardDevices

    NET = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
{body}
""" + TRAIN.format(model="Net().to(DEVICE)", step="loss = model(x).sum()")

    def net(self, body: str) -> str:
        return self.NET.format(body="\n".join("        " + line for line in body.strip().splitlines()))

    def test_device_arguments_follow_the_input(self):
        self.assertTransform(
            self.net('h = torch.zeros(x.size(0), 3, device=DEVICE)\nm = torch.ones(3).to("cuda:0")\nreturn self.fc(x) + h.sum() + m.sum()'),
            self.net("h = torch.zeros(x.size(0), 3, device=x.device)\nm = torch.ones(3).to(x.device)\nreturn self.fc(x) + h.sum() + m.sum()"),
        )

    def test_conditional_device_string_and_torch_device(self):
        self.assertTransform(
            self.net('p = torch.arange(4, device="cuda" if torch.cuda.is_available() else "cpu")\nq = torch.ones(1, device=torch.device("cuda", 0))\nreturn self.fc(x) + p.sum() + q'),
            self.net("p = torch.arange(4, device=x.device)\nq = torch.ones(1, device=x.device)\nreturn self.fc(x) + p.sum() + q"),
        )

    def test_cuda_calls_become_moves_to_the_input_device(self):
        self.assertTransform(
            self.net("mask = torch.ones(4).cuda(non_blocking=True)\nbias = torch.zeros(1).cuda(0)\nreturn self.fc(x * mask) + bias"),
            self.net("mask = torch.ones(4).to(x.device, non_blocking=True)\nbias = torch.zeros(1).to(x.device)\nreturn self.fc(x * mask) + bias"),
        )

    def test_moving_the_input_itself_is_dropped_and_its_comment_kept(self):
        self.assertTransform(
            self.net("# x: (batch, 4)\nx = x.to(DEVICE)\nreturn self.fc(x)"),
            self.net("# x: (batch, 4)\nreturn self.fc(x)"),
        )

    def test_moving_the_input_on_a_line_it_shares_drops_it_alone(self):
        self.assertTransform(
            self.net("# x: (batch, 4)\nx = x.to(DEVICE); h = torch.zeros(1).cuda(); return self.fc(x) + h"),
            self.net("# x: (batch, 4)\nh = torch.zeros(1).to(x.device)\nreturn self.fc(x) + h"),
        )

    def test_a_device_stored_on_the_module(self):
        before = self.net("return self.fc(x.to(self.device))").replace(
            "self.fc = nn.Linear(4, 1)", "self.fc = nn.Linear(4, 1)\n        self.device = DEVICE"
        )
        self.assertTransform(before, before.replace("x.to(self.device)", "x.to(x.device)"))

    def test_dtypes_cpu_and_the_inputs_device_are_left_alone(self):
        code = self.net('y = x.to(torch.float64).to("cpu")\nz = torch.ones(1, device=x.device)\nreturn self.fc(y.float()) + z')
        self.assertTransform(code, code)

    def test_submodules_forward_too(self):
        before = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def forward(self, h):
        return h + torch.ones(1, device="cuda")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.block = Block()

    def forward(self, x):
        return self.block(self.fc(x))
""" + TRAIN.format(model="Net()", step="loss = model(x).sum()")
        self.assertTransform(before, before.replace('device="cuda"', "device=h.device"))

    def test_forward_without_an_input_is_reported_missing(self):
        code = self.net("return self.fc(torch.ones(1, 4, device=DEVICE))").replace("def forward(self, x)", "def forward(self)")
        code = code.replace("model(x)", "model()")
        self.assertTransform(code, code)
        ((missing),) = self.report(code).missing
        assert missing.line == line_of(code, "return self.fc(torch.ones") and "input tensor's .device" in missing.todo


class TestWrapDataParallel(TransformTest):
    TRANSFORM = WrapDataParallel

    def script(self, imports: str, model: str = "nn.Linear(4, 1).to(device)") -> str:
        return imports + '\nfrom torch.utils.data import DataLoader, TensorDataset\ndevice = "cuda:0" if torch.cuda.is_available() else "cpu"\n' + TRAIN.format(
            model=model, step="loss = model(x).sum()"
        )

    def wrapped(self, code: str, line: str) -> str:
        return code.replace("    optimizer = ", f"    {line}\n    optimizer = ", 1)

    def test_import_torch_nn_as_nn(self):
        code = self.script("import torch\nimport torch.nn as nn")
        self.assertTransform(code, self.wrapped(code, "model = nn.DataParallel(model)"))

    def test_from_torch_import_nn(self):
        code = self.script("import torch\nfrom torch import nn")
        self.assertTransform(code, self.wrapped(code, "model = nn.DataParallel(model)"))

    def test_only_import_torch(self):
        code = self.script("import torch", model="torch.nn.Linear(4, 1).to(device)")
        self.assertTransform(code, self.wrapped(code, "model = torch.nn.DataParallel(model)"))

    def test_torch_under_another_name(self):
        code = self.script("import torch as th\nimport torch", model="th.nn.Linear(4, 1).to(device)")
        self.assertTransform(code, self.wrapped(code, "model = th.nn.DataParallel(model)"))

    def test_a_model_on_another_gpu_leads_device_ids(self):
        code = self.script("import torch\nfrom torch import nn", model='nn.Linear(4, 1).to("cuda:1")')
        line = "model = nn.DataParallel(model, device_ids=[1] + [i for i in range(torch.cuda.device_count()) if i != 1])"
        self.assertTransform(code, self.wrapped(code, line))

    def test_after_a_conditional_move(self):
        code = self.script("import torch\nfrom torch import nn", model="nn.Linear(4, 1)")
        code = code.replace("    optimizer = ", "    if torch.cuda.is_available():\n        model = model.cuda()\n    optimizer = ", 1)
        self.assertTransform(code, self.wrapped(code, "model = nn.DataParallel(model)"))

    def test_inside_the_main_block_before_training(self):
        before = """
        import torch
        from torch import nn

        if __name__ == "__main__":
            model = nn.Linear(4, 1).to("cuda")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.randn(8, 4)).sum().backward()
        """
        after = before.replace('.to("cuda")\n', '.to("cuda")\n            model = nn.DataParallel(model)\n')
        self.assertTransform(before, after)

    def test_a_block_that_goes_on_to_train_keeps_the_wrap(self):
        before = """
        import torch
        from torch import nn


        def main():
            try:
                model = nn.Linear(4, 1).to("cuda")
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                model(torch.randn(8, 4)).sum().backward()
            finally:
                print("done")
        """
        after = before.replace('.to("cuda")\n', '.to("cuda")\n                model = nn.DataParallel(model)\n')
        self.assertTransform(before, after)

    def test_a_model_kept_on_an_object(self):
        before = """
        import torch
        from torch import nn


        class Trainer:
            def __init__(self, net):
                self.model = net.to("cuda")
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)


        Trainer(nn.Linear(4, 1))
        """
        after = before.replace('net.to("cuda")\n', 'net.to("cuda")\n                self.model = nn.DataParallel(self.model)\n')
        self.assertTransform(before, after)

    def test_advice_when_the_script_hides_gpus(self):
        code = self.script("import os\nimport torch\nfrom torch import nn\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'")
        ((line, message),) = self.advice(code)
        assert line == line_of(code, "CUDA_VISIBLE_DEVICES") and "only uses the GPUs it lists" in message

    def test_nothing_to_wrap_is_left_to_the_pipeline_and_an_unplaced_model_advised(self):
        report = self.report("import torch\nmodel = torch.nn.Linear(2, 2)\n")
        assert not report.fulfilled and not report.missing and not report.advice  # the pipeline names the undone duty
        code = self.script("import torch\nfrom torch import nn", model="nn.Linear(4, 1)")
        ((line, message),) = self.advice(code)
        assert line == line_of(code, "model = nn.Linear") and "not moved to a GPU" in message


class TestMeanLoss(TransformTest):
    TRANSFORM = MeanLoss

    HEAD = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.criterion = nn.MSELoss()

    def forward(self, x, y=None):
        pred = self.fc(x)
{returns}
"""

    def script(self, returns: str, step: str) -> str:
        body = "\n".join("        " + line for line in returns.strip().splitlines())
        return self.HEAD.format(returns=body) + TRAIN.format(model="nn.DataParallel(Net())", step=step)

    def test_scalar_loss_is_averaged_where_it_comes_out(self):
        code = self.script("return F.mse_loss(pred, y)", "loss = model(x, y)")
        self.assertTransform(code, code.replace("loss = model(x, y)", "loss = model(x, y).mean()"))

    def test_criterion_attribute_and_direct_backward(self):
        code = self.script("return self.criterion(pred, y)", "loss = 0\n        model(x, y).backward()")
        self.assertTransform(code, code.replace("model(x, y).backward()", "model(x, y).mean().backward()"))

    def test_tuple_with_the_loss_is_averaged_after_unpacking(self):
        code = self.script("if y is None:\n    return pred\nloss = F.mse_loss(pred, y)\nreturn loss, pred", "loss, pred = model(x, y=y)")
        after = code.replace(
            "loss, pred = model(x, y=y)\n",
            "loss, pred = model(x, y=y)\n        loss = loss.mean()  # DataParallel returns one loss per GPU\n",
        )
        self.assertTransform(code, after)

    def test_dict_items_holding_the_loss(self):
        code = self.script('return {"loss": F.l1_loss(pred, y), "pred": pred}', 'out = model(x, y)\n        loss = out["loss"]\n        print(out["loss"].item(), out["pred"].shape)')
        after = code.replace('loss = out["loss"]', 'loss = out["loss"].mean()').replace('out["loss"].item()', 'out["loss"].mean().item()')
        self.assertTransform(code, after)

    def test_already_averaged_and_calls_without_the_loss_stay(self):
        code = self.script(
            "if y is None:\n    return pred\nreturn F.mse_loss(pred, y)",
            "loss = model(x, y).mean()\n        preds = model(x)",
        )
        self.assertTransform(code, code)

    def test_a_loss_forward_computes_without_a_loss_function_is_known_by_its_backward(self):
        code = self.script("return ((pred - y) ** 2).mean()", "loss = model(x, y)")
        self.assertTransform(code, code.replace("loss = model(x, y)", "loss = model(x, y).mean()"))

    def test_outputs_that_are_not_losses_stay(self):
        code = self.script("return pred", "loss = F.mse_loss(model(x), y)")
        self.assertTransform(code, code)


class TestDPModuleAccess(TransformTest):
    TRANSFORM = DPModuleAccess

    def test_custom_attributes_and_checkpoints_after_the_wrap(self):
        before = """
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)
                self.classes = ["a", "b"]

            def forward(self, x):
                return self.fc(x)


        model = Net()
        print(model.classes)
        model = nn.DataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        print(model.classes, model.fc.weight.mean().item())
        torch.save(model.state_dict(), "model.pt")
        """
        after = before.replace(
            "print(model.classes, model.fc", "print(model.module.classes, model.module.fc"
        ).replace("torch.save(model.state_dict()", "torch.save(model.module.state_dict()")
        self.assertTransform(before, after)


    METHODS = """
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(x)

    def predict(self, x):
        return self(x)

    def compute_loss(self, x, y):
        return F.mse_loss(self.fc(x), y)


model = nn.DataParallel(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(8, 4), torch.randn(8, 1)
"""

    def test_a_method_that_only_calls_forward_is_called_through_the_wrapper_in_training(self):
        before = self.METHODS + "loss = F.mse_loss(model.predict(x), y)\nloss.backward()\nprint(model.predict(x))\n"
        after = before.replace("F.mse_loss(model.predict(x)", "F.mse_loss(model(x)").replace("print(model.predict", "print(model.module.predict")
        self.assertTransform(before, after)

    def test_another_method_in_a_training_step_is_missing(self):
        before = self.METHODS + "loss = model.compute_loss(x, y)\nloss.backward()\n"
        self.assertTransform(before, before.replace("model.compute_loss", "model.module.compute_loss"))
        ((line, what),) = self.missing(before)
        assert line == line_of(before, "loss = model.compute_loss") and "DataParallel parallelises forward alone" in what


class TestScatterGather(TransformTest):
    TRANSFORM = ScatterGather

    HEAD = """
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(4, 8, 2{batch_first})
        self.head = nn.Linear(8, 1)

    def forward(self, x, state=None, lengths=None):
{body}


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 5, 4)
{step}
loss = out.sum()
loss.backward()
"""

    def script(self, body: str, step: str, batch_first: bool = True) -> str:
        body = "\n".join("        " + line for line in body.strip().splitlines())
        return self.HEAD.format(body=body, step=step, batch_first=", batch_first=True" if batch_first else "")

    def test_a_hidden_state_made_by_the_caller_is_missing(self):
        code = self.script("out, state = self.rnn(x, state)\nreturn self.head(out), state", "h = (torch.zeros(2, 8, 8), torch.zeros(2, 8, 8))\nout, h = model(x, h)")
        self.assertTransform(code, code)
        ((line, what),) = self.missing(code)
        assert line == line_of(code, "out, h = model(x, h)") and "`state` is the hidden state of self.rnn" in what

    def test_a_state_that_only_comes_out_of_the_model_splits_back_as_it_was_gathered(self):
        code = self.script("out, state = self.rnn(x, state)\nreturn self.head(out), state", "h = None\nout, h = model(x)\nout, h = model(x, h)")
        assert not self.missing(code)

    def test_a_state_forward_makes_from_the_input_s_shape_is_not_an_argument(self):
        code = self.script("h0 = torch.zeros(2, x.size(0), 8)\nout, _ = self.rnn(x, (h0, h0))\nreturn self.head(out)", "out = model(x)")
        assert not self.missing(code)

    def test_a_sequence_first_input_is_missing_unless_forward_transposes_it(self):
        step = "out = model(x)"
        assert [what for _, what in self.missing(self.script("out, _ = self.rnn(x)\nreturn self.head(out)", step, batch_first=False))]
        assert not self.missing(self.script("out, _ = self.rnn(x.transpose(0, 1))\nreturn self.head(out)", step, batch_first=False))
        assert not self.missing(self.script("out, _ = self.rnn(x)\nreturn self.head(out)", step))

    def test_a_padded_output_of_per_replica_length_is_missing(self):
        body = "packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)\nout, _ = self.rnn(packed)\nout, _ = pad_packed_sequence(out, batch_first=True{total})\nreturn self.head(out{last})"
        step = "out = model(x, lengths=torch.full((8,), 5))"
        ((line, what),) = self.missing(self.script(body.format(total="", last=""), step))
        assert line == line_of(self.script(body.format(total="", last=""), step), "out = model(") and "cannot gather" in what
        assert not self.missing(self.script(body.format(total=", total_length=5", last=""), step))
        assert not self.missing(self.script(body.format(total="", last="[:, -1]"), step))


class TestForwardState(TransformTest):
    TRANSFORM = ForwardState

    CODE = """
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 1)
            self.calls = 0
            self.seen = []
            self.register_buffer("total", torch.zeros(1))

        def forward(self, x):
            self.calls += 1
            self.seen.append(x.shape[0])
            self.total.add_(x.sum())
            self.remember(x)
            out = self.fc(x)
            return out

        def remember(self, x):
            self.last = x.detach()


    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    """

    def test_code_is_kept_and_each_change_of_state_is_reported_missing(self):
        self.assertTransform(self.CODE, self.CODE)
        missing = self.missing(self.CODE)
        assert [line for line, _ in missing] == [line_of(self.CODE, s) for s in ("self.calls +=", "self.seen.append", "self.total.add_", "self.last =")]
        assert missing[0][1].startswith("`self.calls += 1` changes the model inside forward()")


class TestBatchSizeAdvice(TransformTest):
    TRANSFORM = BatchSizeAdvice

    def script(self, loader: str, head: str = "") -> str:
        return "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n" + head + TRAIN.format(
            model="nn.Linear(4, 1)", step="loss = model(x).sum()"
        ).replace("DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=8)", loader)

    def test_small_literal_batch_is_advised_where_written(self):
        code = self.script("DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)),\n                      batch_size=2)")
        ((line, message),) = self.advice(code)
        assert line == line_of(code, "batch_size=2") and message.startswith("batch size 2 is small for DataParallel")

    def test_batch_size_from_a_constant(self):
        code = self.script("DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=BATCH)", head="BATCH = 1\n")
        assert [line for line, _ in self.advice(code)] == [line_of(code, "BATCH = 1")]

    def test_default_batch_of_one(self):
        code = self.script("DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)))")
        ((line, message),) = self.advice(code)
        assert line == line_of(code, "for x, y in DataLoader") and message.startswith("DataLoader without batch_size loads one sample per batch")

    def test_large_or_unknown_batches_are_fine(self):
        assert self.advice(self.script("DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=64)")) == []
        code = self.script("DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=int(input()))")
        assert self.advice(code) == []
