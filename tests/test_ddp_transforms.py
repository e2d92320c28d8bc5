"""Each DDP transform on small snippets, before/after, in the style of LibCST's `CodemodTest.assertCodemod`.

`assert_codemod(transforms, before, after)` runs just those transforms (each on a fresh anatomy of the
previous one's output, as the full conversion does) over the dedented `before` and compares the
result with the dedented `after`. Whole-script behaviour is in test_ddp_codemod.py.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from ddpify.anatomy import analyze
from ddpify.codemods.options import Options
from ddpify.codemods.ddp import (
    DDP_TRANSFORMS,
    AveragedOwnedOptimizers,
    BatchesOfEachRank,
    DDPModuleAccess,
    DistributedSamplers,
    EnvironmentsOfEachRank,
    EvaluationSharding,
    DistributedSetup,
    HandAveragedGradients,
    NoSyncAccumulation,
    NoSyncDiscardedGradients,
    RankDevices,
    RankZeroDuties,
    ReducedLossPrints,
    RemoveDataParallel,
    RowsOfEachRank,
    NoiseOfEachRank,
    SameSplitOnEveryRank,
    SeedBeforeShardedData,
    SeedWhereReproducibilityIsAskedFor,
    SumLossScaling,
    WrapModel,
)
from ddpify.codemods.ddp.batch_copies import NonBlockingBatchCopies
from ddpify.codemods.ddp.per_node import PerNodeDownloads
from ddpify.codemods.ddp.runtime import HELPERS
from ddpify.codemods.ddp.wrap import GRADIENT_VIEWS, option_comments
from ddpify.codemods.pipeline import ConversionResult, Status, run_pipeline
from ddpify.convert import convert_source
from helpers import one_line

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def assert_codemod(transforms, before: str, after: str, *, batch_size: str = "per-gpu") -> ConversionResult:
    before, after = textwrap.dedent(before), textwrap.dedent(after)
    result = run_pipeline(before, "snippet.py", list(transforms), Options(batch_size=batch_size))
    assert result.output == after
    return result


def joined(*parts: str) -> str:
    """Dedented parts, one after the other (dedent each: they are indented differently)."""
    return "".join(textwrap.dedent(part) for part in parts)


def messages(result: ConversionResult) -> list[str]:
    """What the conversion tells the user to look at: its warnings and what it could not do."""
    return [a.message for a in result.advice] + [f"{m.what}; {m.todo}" for m in result.missing]


def test_the_ddp_transforms_in_order():
    assert DDP_TRANSFORMS == (
        DistributedSetup, SeedBeforeShardedData, SeedWhereReproducibilityIsAskedFor, RankDevices, NonBlockingBatchCopies, RemoveDataParallel, WrapModel,
        AveragedOwnedOptimizers, DDPModuleAccess, SameSplitOnEveryRank, NoiseOfEachRank, DistributedSamplers, RowsOfEachRank, HandAveragedGradients, BatchesOfEachRank, EnvironmentsOfEachRank, EvaluationSharding, ReducedLossPrints,
        RankZeroDuties,
        NoSyncAccumulation, NoSyncDiscardedGradients, SumLossScaling, PerNodeDownloads,
    )
    for transform in DDP_TRANSFORMS:
        assert transform.NAME and transform.__doc__, transform


# ===== setup ===================================================================================
class TestSetup:
    def test_main_guard_joins_and_leaves_the_process_group(self):
        result = assert_codemod(
            [DistributedSetup],
            '''\
            """Doc."""
            import torch


            def main():
                pass


            if __name__ == "__main__":
                main()
            ''',
            joined(
                '''\
                """Doc."""
                import torch
                import gc
                import os
                import torch.distributed as dist
                ''',
                HELPERS,
                """\


                def main():
                    pass


                if __name__ == "__main__":
                    setup_distributed()
                    try:
                        main()
                    finally:
                        cleanup_distributed()
                """,
            ),
        )
        assert [(c.line, c.transform) for c in result.changes] == [(2, "setup"), (9, "setup")]

    def test_top_level_script_joins_after_the_imports_and_leaves_at_the_end(self):
        assert_codemod(
            [DistributedSetup],
            """\
            import os
            import torch

            x = torch.ones(1)
            print(x)
            """,
            joined(
                """\
                import os
                import torch
                import gc
                import torch.distributed as dist
                """,
                HELPERS,
                """\
                setup_distributed()

                x = torch.ones(1)
                print(x)

                cleanup_distributed()
                """,
            ),
        )

    def test_helpers_go_after_the_whole_opening_block_of_imports(self):
        result = run_pipeline(
            textwrap.dedent("""\
            import torch
            try:
                import wandb
            except ImportError:
                wandb = None
            from torch import nn

            CONST = 1
            """),
            "snippet.py", [DistributedSetup], Options(),
        )
        lines = result.output.splitlines()
        assert lines.index("from torch import nn") < lines.index("def setup_distributed():") < lines.index("CONST = 1")
        assert lines.index("setup_distributed()") > lines.index("def cleanup_distributed():")
        assert lines[-1] == "cleanup_distributed()"
        assert result.output.count("import os") == 1

    def test_cleanup_collects_the_wrappers_before_leaving_the_group(self):
        cleanup = next(f for f in ast.parse(HELPERS).body if isinstance(f, ast.FunctionDef) and f.name == "cleanup_distributed")
        calls = [ast.unparse(n.func) for n in ast.walk(cleanup) if isinstance(n, ast.Call)]
        assert calls.index("gc.collect") < calls.index("dist.destroy_process_group")

    def test_module_level_wrappers_are_deleted_before_cleanup(self):
        script = textwrap.dedent("""\
            import torch
            from torch.utils.data import DataLoader, TensorDataset

            model = torch.nn.Linear(4, 1)
            critic = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD([*model.parameters(), *critic.parameters()], lr=0.1)
            for x, y in DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4):
                optimizer.zero_grad()
                (model(x) - critic(x) - y).pow(2).mean().backward()
                optimizer.step()
            """)
        lines = convert_source(script, "ddp", path="train.py").output.splitlines()
        assert lines[-2:] == ["del model, critic", "cleanup_distributed()"]

    def test_wrappers_local_to_a_function_are_left_to_the_collection(self):
        output = convert_source((FIXTURES / "basic_main.py").read_text(), "ddp", path="basic_main.py").output
        assert "del model" not in output and output.rstrip().endswith("cleanup_distributed()")

    def test_a_script_without_imports_is_left_incomplete(self):
        result = assert_codemod([DistributedSetup], "x = 1\n", "x = 1\n")
        assert result.status is Status.INCOMPLETE and "import torch" in result.missing[0].what


# ===== summed losses ===========================================================================
class TestSumLoss:
    HEAD = textwrap.dedent("""\
        import torch
        import torch.nn.functional as F
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 2), torch.randn(4, 1)
        """)

    def test_a_loss_summed_over_the_batch_is_scaled_by_the_world_size(self):
        result = assert_codemod(
            [SumLossScaling],
            self.HEAD + "loss = F.mse_loss(model(x), y, reduction='sum')\nloss.backward()\n",
            self.HEAD + "loss = F.mse_loss(model(x), y, reduction='sum')\n(loss * WORLD_SIZE).backward()\n",
        )
        assert [c.transform for c in result.changes] == ["sum_loss"]

    def test_the_old_size_average_false_spelling_sums_too(self):
        assert_codemod(
            [SumLossScaling],
            self.HEAD + "loss = F.mse_loss(model(x), y, size_average=False)\nloss.backward()\n",
            self.HEAD + "loss = F.mse_loss(model(x), y, size_average=False)\n(loss * WORLD_SIZE).backward()\n",
        )

    def test_a_criterion_built_to_sum_inside_a_helper_is_followed_and_the_scaler_argument_scaled(self):
        helper = "crit = torch.nn.MSELoss(reduction='sum')\ndef loss_fn(p, t):\n    return crit(p, t) + 0.5\n"
        assert_codemod(
            [SumLossScaling],
            self.HEAD + helper + "scaler = torch.amp.GradScaler()\nscaler.scale(loss_fn(model(x), y)).backward()\n",
            self.HEAD + helper + "scaler = torch.amp.GradScaler()\nscaler.scale((loss_fn(model(x), y) * WORLD_SIZE)).backward()\n",
        )

    def test_averaged_losses_and_mixed_ones_are_left_alone(self):
        mean = self.HEAD + "F.mse_loss(model(x), y).backward()\n"
        assert not assert_codemod([SumLossScaling], mean, mean).changes
        mixed = self.HEAD + "loss = F.mse_loss(model(x), y, reduction='sum') + F.l1_loss(model(x), y)\nloss.backward()\n"
        result = assert_codemod([SumLossScaling], mixed, mixed)
        assert "multiply only the summed terms" in result.advice[0].message

    def test_a_reduction_chosen_at_run_time_gets_advice(self):
        code = self.HEAD + "import sys\nloss = F.mse_loss(model(x), y, reduction=sys.argv[1])\nloss.backward()\n"
        result = assert_codemod([SumLossScaling], code, code)
        assert "chosen at run time" in result.advice[0].message

    def test_a_mean_over_tokens_gets_advice_with_the_exact_fix(self):
        tokens = "t = torch.tensor([1, 0, 1, 1])\n"
        ignored = self.HEAD + tokens + "loss = F.cross_entropy(torch.randn(4, 3), t, ignore_index=0)\nloss.backward()\n"
        masked = self.HEAD + tokens + ("mask = (t != 0).float()\nn_tokens = mask.sum().clamp(min=1)\n"
                                       "loss = (F.mse_loss(model(x), y, reduction='none').squeeze(1) * mask).sum() / n_tokens\nloss.backward()\n")
        for code in (ignored, masked):
            advice = messages(assert_codemod([SumLossScaling], code, code))
            assert len(advice) == 1 and "the mean of the ranks' means is not the mean over all tokens" in advice[0], code
        per_sample = self.HEAD + "loss = (F.mse_loss(model(x), y, reduction='none')).sum() / x.size(0)\nloss.backward()\n"
        assert not messages(assert_codemod([SumLossScaling], per_sample, per_sample))


# ===== devices =================================================================================
class TestDevices:
    def test_explicit_gpu_indices_become_local_rank(self):
        result = assert_codemod(
            [RankDevices],
            """\
            import torch
            a = torch.device("cuda:0")
            b = torch.device("cuda", 0)
            m = torch.nn.Linear(2, 2).cuda(0)
            torch.cuda.set_device(0)
            x = torch.zeros(2).to(0)
            d = "cuda:0" if torch.cuda.is_available() else "cpu"
            """,
            """\
            import torch
            a = torch.device(f"cuda:{LOCAL_RANK}")
            b = torch.device("cuda", LOCAL_RANK)
            m = torch.nn.Linear(2, 2).cuda(LOCAL_RANK)
            torch.cuda.set_device(LOCAL_RANK)
            x = torch.zeros(2).to(LOCAL_RANK)
            d = f"cuda:{LOCAL_RANK}" if torch.cuda.is_available() else "cpu"
            """,
        )
        assert sorted(c.line for c in result.changes) == [2, 3, 4, 5, 6, 7]

    def test_cuda_without_an_index_already_means_this_ranks_gpu(self):
        code = """\
            import torch
            a = torch.device("cuda")
            b = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            m = torch.nn.Linear(2, 2).cuda()
            x = torch.zeros(2).to("cpu")
            n = torch.cuda.device_count()
            """
        result = assert_codemod([RankDevices], code, code)
        assert not result.changes and not result.advice

    def test_cuda_visible_devices_is_advised_against(self):
        code = """\
            import os
            import torch
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            """
        result = assert_codemod([RankDevices], code, code)
        assert [a.line for a in result.advice] == [3]
        assert "CUDA_VISIBLE_DEVICES" in result.advice[0].message


# ===== wrap ====================================================================================
TRAIN = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
{model}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            loss = (model(x.to(device)) - y.to(device)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
{after}"""
WRAP = "DDP(model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None, gradient_as_bucket_view=True)"
WHY = option_comments(GRADIENT_VIEWS)
DDP_IMPORT = "from torch.nn.parallel import DistributedDataParallel as DDP\n"


def train(model: str, after: str = "", wrap_import: bool = False) -> str:
    code = TRAIN.format(model=textwrap.indent(textwrap.dedent(model), "    ").rstrip("\n"), after=after)
    return code.replace("TensorDataset\n", "TensorDataset\n" + DDP_IMPORT, 1) if wrap_import else code


MODELS = """\
class Gated(nn.Module):
    def __init__(self, use_norm):
        super().__init__()
        self.use_norm, self.norm, self.fc = use_norm, nn.LayerNorm(2), nn.Linear(2, 1)

    def forward(self, x):
        if self.use_norm:
            x = self.norm(x)
        return self.fc(x)


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.a, self.b = nn.Linear(2, 4), nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x):
        h = self.body(x)
        out = self.a(h)
        return out, self.b(h)


class RandomDepth(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.fc = nn.Linear(2, 2), nn.Linear(2, 1)

    def forward(self, x):
        for _ in range(int(torch.randint(0, 4, (1,)))):
            x = self.inner(x)
        return self.fc(x)


class Leftover(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.act, self.fc = nn.Embedding(3, 2), nn.ReLU(), nn.Linear(2, 1)

    def forward(self, x):
        return self.fc(x)


class Walked(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 1)

    def forward(self, x):
        for layer in self.children():
            x = layer(x)
        return x


class Aliased(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 1)
        fc = self.fc
        self.run = lambda x: fc(x)

    def forward(self, x):
        return self.run(x)


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.act, self.drop, self.fc = nn.ReLU(), nn.Dropout(0.1), nn.Linear(2, 1)

    def forward(self, x):
        return self.fc(x)


class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 1)

    def forward(self, x):
        out = self.fc(x)
        return out, out.pow(2).mean()


"""


def unused_wrap(model: str, use: str) -> bool:
    """Does the wrap of `model`, trained through `use`, find unused parameters?"""
    code = TRAIN.replace("def main():", MODELS + "def main():").format(model=f"    model = {model}", after="")
    output = convert_source(code.replace("loss = (model(x.to(device)) - y.to(device)).pow(2).mean()", use), "ddp").output
    return "find_unused_parameters=True" in output


class TestUnusedParameters:
    def test_a_submodule_called_on_some_paths_only(self):
        assert unused_wrap("Gated(False)", "loss = (model(x) - y).pow(2).mean()")

    def test_a_step_that_drops_an_output_a_head_computes(self):
        assert unused_wrap("Heads()", "out, _ = model(x)\n            loss = (out - y).pow(2).mean()")
        assert unused_wrap("Heads()", "loss = (model(x)[0] - y).pow(2).mean()")

    def test_a_layer_called_a_random_number_of_times_none_included(self):
        assert unused_wrap("RandomDepth()", "loss = (model(x) - y).pow(2).mean()")

    def test_a_layer_built_that_the_forward_never_calls(self):
        assert unused_wrap("Leftover()", "loss = (model(x) - y).pow(2).mean()")

    def test_a_dropped_output_of_a_model_moved_where_it_is_built(self):
        assert unused_wrap("Heads().to(device)", "out, _ = model(x)\n            loss = (out - y).pow(2).mean()")

    def test_layers_reached_without_their_names_or_without_parameters(self):
        for model in ("Walked()", "Aliased()", "Unused()"):
            assert not unused_wrap(model, "loss = (model(x) - y).pow(2).mean()"), model

    def test_every_output_used_or_a_dropped_output_computed_from_the_others(self):
        assert not unused_wrap("Heads()", "a, b = model(x)\n            loss = (a + b - y).pow(2).mean()")
        assert not unused_wrap("WithLoss()", "_, loss = model(x)")
        assert not unused_wrap("nn.Linear(2, 1)", "loss = (model(x) - y).pow(2).mean()")


class TestWrap:
    def test_wrap_after_the_model_reaches_its_device(self):
        result = assert_codemod(
            [WrapModel],
            train("model = nn.Linear(2, 1)\nmodel.to(device)\n"),
            train(f"model = nn.Linear(2, 1)\nmodel.to(device)\n{WHY}model = {WRAP}\n", wrap_import=True),
        )
        assert [(c.line, c.transform) for c in result.changes] == [(10, "wrap")]
        assert not result.advice

    def test_wrap_right_after_a_binding_that_moves_it(self):
        assert_codemod(
            [WrapModel],
            train("model = nn.Linear(2, 1).to(device)\n"),
            train(f"model = nn.Linear(2, 1).to(device)\n{WHY}model = {WRAP}\n", wrap_import=True),
        )

    def test_a_model_on_self(self):
        before = textwrap.dedent("""\
            import torch
            from torch import nn


            class Trainer:
                def __init__(self, device):
                    self.model = nn.Linear(2, 1).to(device)
                    self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

                def fit(self, loader):
                    for x, y in loader:
                        loss = (self.model(x) - y).pow(2).mean()
                        self.opt.zero_grad()
                        loss.backward()
                        self.opt.step()
            """)
        after = before.replace(
            "from torch import nn\n", "from torch import nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        ).replace(
            "self.model = nn.Linear(2, 1).to(device)\n",
            "self.model = nn.Linear(2, 1).to(device)\n"
            + textwrap.indent(WHY, "        ")
            + "        self.model = DDP(self.model, device_ids=[LOCAL_RANK] if next(self.model.parameters()).is_cuda else None, "
            "gradient_as_bucket_view=True)\n",
        )
        assert_codemod([WrapModel], before, after)

    def test_batchnorm_becomes_syncbatchnorm_on_gpus(self):
        model = "model = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)).to(device)\n"
        result = assert_codemod(
            [WrapModel],
            train(model),
            train(
                model
                + "if next(model.parameters()).is_cuda:  # SyncBatchNorm runs on GPUs only\n"
                + "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
                + f"{WHY}model = {WRAP}\n",
                wrap_import=True,
            ),
        )
        assert any("SyncBatchNorm" in c.message for c in result.changes)

    def test_no_syncbatchnorm_without_batchnorm(self):
        result = run_pipeline(train("model = nn.Linear(2, 1).to(device)\n"), "snippet.py", [WrapModel], Options())
        assert "SyncBatchNorm" not in result.output

    def test_a_model_never_moved_is_wrapped_and_advised(self):
        result = assert_codemod(
            [WrapModel],
            train("model = nn.Linear(2, 1)\n"),
            train(f"model = nn.Linear(2, 1)\n{WHY}model = {WRAP}\n", wrap_import=True),
        )
        assert any("never moved to a GPU" in m for m in messages(result))

    def test_no_trained_model_leaves_the_conversion_incomplete(self):
        code = "import torch\nx = torch.ones(1)\n"
        result = assert_codemod([WrapModel], code, code)
        assert result.status is Status.INCOMPLETE
        assert [m.what for m in result.missing] == [WrapModel.DUTY.what]

    def test_wrap_after_a_conditional_move_is_outside_the_condition(self):
        assert_codemod(
            [WrapModel],
            train("model = nn.Linear(2, 1)\nif torch.cuda.is_available():\n    model = model.cuda()\n"),
            train(f"model = nn.Linear(2, 1)\nif torch.cuda.is_available():\n    model = model.cuda()\n{WHY}model = {WRAP}\n",
                  wrap_import=True),
        )


# ===== .module =================================================================================
MODULE_SCRIPT = """\
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.vocab = ["a", "b"]

    def forward(self, x):
        return self.fc(x)

    def generate(self, n):
        return self.fc.weight[:n]


model = LM()
print(model.vocab, model.generate(1))
model = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model.train()
for x in [torch.ones(1, 2)]:
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
model.eval()
{tail}"""


class TestModuleAccess:
    def check(self, tail_before: str, tail_after: str):
        return assert_codemod(
            [DDPModuleAccess],
            MODULE_SCRIPT.format(tail=textwrap.dedent(tail_before)),
            MODULE_SCRIPT.format(tail=textwrap.dedent(tail_after)),
        )

    def test_custom_methods_and_attributes_go_through_module(self):
        result = self.check(
            "out = model.generate(1)\nprint(model.vocab)\n",
            "out = model.module.generate(1)\nprint(model.module.vocab)\n",
        )
        assert sorted(c.message for c in result.changes) == [
            "model.generate -> model.module.generate", "model.vocab -> model.module.vocab"]

    def test_state_dict_and_load_state_dict_go_through_module(self):
        self.check(
            'torch.save(model.state_dict(), "m.pt")\nmodel.load_state_dict(torch.load("m.pt"))\n',
            'torch.save(model.module.state_dict(), "m.pt")\nmodel.module.load_state_dict(torch.load("m.pt"))\n',
        )

    def test_only_the_first_attribute_of_a_chain(self):
        self.check(
            "w = model.fc.weight.detach().cpu().tolist()\n",
            "w = model.module.fc.weight.detach().cpu().tolist()\n",
        )

    def test_what_the_wrapper_answers_itself_is_left_alone(self):
        code = "model.train()\nmodel.eval()\nn = sum(p.numel() for p in model.parameters())\nmodel.zero_grad()\nmodel.to('cpu')\n"
        result = self.check(code, code)
        assert not result.changes

    def test_accesses_before_the_wrap_and_inside_the_model_class_are_left_alone(self):
        result = self.check("", "")
        assert "print(model.vocab, model.generate(1))" in result.output
        assert "return self.fc.weight[:n]" in result.output
        assert not result.changes

    def test_saving_the_whole_model_saves_the_unwrapped_module(self):
        self.check('torch.save(model, "full.pt")\n', 'torch.save(model.module, "full.pt")\n')

    def test_a_copy_of_the_model_copies_the_unwrapped_module(self):
        self.check("import copy\nema = copy.deepcopy(model)\n", "import copy\nema = copy.deepcopy(model.module)\n")

    def test_tracing_calls_and_a_writers_add_graph_trace_the_unwrapped_module(self):
        result = self.check(
            "from torch.utils.tensorboard import SummaryWriter\nwriter = SummaryWriter()\nwriter.add_graph(model, x)\n"
            "traced = torch.jit.trace(model, x)\ntorch.onnx.export(model, x, 'm.onnx')\n",
            "from torch.utils.tensorboard import SummaryWriter\nwriter = SummaryWriter()\nwriter.add_graph(model.module, x)\n"
            "traced = torch.jit.trace(model.module, x)\ntorch.onnx.export(model.module, x, 'm.onnx')\n",
        )
        assert [c.message.split(" (")[0] for c in result.changes] == [
            "writer.add_graph(model) -> traces model.module", "torch.jit.trace(model) -> traces model.module",
            "torch.onnx.export(model) -> traces model.module"]

    def test_indexing_the_model_indexes_the_unwrapped_module(self):
        self.check('torch.save(model[0].state_dict(), "first.pt")\n', 'torch.save(model.module[0].state_dict(), "first.pt")\n')

    def test_a_callable_object_handed_the_wrapper_reads_its_state_through_module(self):
        stopper = (
            "class Stopper:\n"
            "    def __call__(self, loss, net):\n"
            "        self.save(net)\n\n"
            "    def save(self, net):\n"
            "        torch.save(net.state_dict(), 'best.pt')\n\n\n"
            "stop = Stopper()\n"
            "stop(loss, model)\n"
        )
        self.check(stopper, stopper.replace("net.state_dict()", "net.module.state_dict()"))

    def test_through_the_full_conversion(self):
        source = MODULE_SCRIPT.format(tail="print(model.vocab)\n").replace(DDP_IMPORT, "").replace("model = DDP(model)\n", "")
        output = convert_source(source, "ddp").output
        assert "    print(model.module.vocab)\n" in output
        # the wrap comes right after the model is built (it is never moved), so this one is after it too
        assert "    print(model.module.vocab, model.module.generate(1))\n" in output


    RELOADED = MODULE_SCRIPT.replace("model = DDP(model)\n", "").replace(DDP_IMPORT, "").format(tail=textwrap.dedent("""\
        def sample():
            return model.generate(1)


        def vocabulary(net):
            return net.vocab


        names = vocabulary(model)
        print(sample(), names)
        torch.save(model, "full.pt")
        model = torch.load("full.pt", weights_only=False)
        names = vocabulary(LM())
        print(sample(), names)
        """))

    def test_a_name_rebound_to_a_plain_model_after_the_wrap_is_unwrapped_only_where_it_is_a_wrapper(self):
        output = convert_source(self.RELOADED, "ddp").output
        # sample() reads the global model: the wrapper, then the plain model reloaded after training
        assert "    return plain_model(model).generate(1)\n" in output
        # vocabulary(net) is handed the wrapper by one call, a plain model by the other
        assert "    return plain_model(net).vocab\n" in output
        assert "def plain_model(model):\n" in output
        assert '    torch.save(model.module, "full.pt")\n' in output  # only the wrapper reaches the save

    def test_a_model_read_only_before_the_reload_keeps_module(self):
        source = self.RELOADED.replace("names = vocabulary(LM())\nprint(sample(), names)", "print(model.vocab)")
        output = convert_source(source, "ddp").output
        assert "    return model.module.generate(1)\n" in output
        assert "    return net.module.vocab\n" in output
        assert "plain_model" not in output

# ===== samplers ================================================================================
LOADER_SCRIPT = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

model = nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ds = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
{code}"""
STEP = """\
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
PER_GPU = "# ddpify: batch_size per process; global = batch_size * WORLD_SIZE\n"
SAMPLER_IMPORT = ("from torch.utils.data import DataLoader, Subset, TensorDataset",
                  "from torch.utils.data import DistributedSampler, DataLoader, Subset, TensorDataset")


def loader_script(code: str, sampler_import: bool = False) -> str:
    script = LOADER_SCRIPT.format(code=textwrap.dedent(code))
    return script.replace(*SAMPLER_IMPORT) if sampler_import else script


class TestSameSplitOnEveryRank:
    SPLIT = "import torch\nfrom torch.utils.data import TensorDataset, random_split\nds = TensorDataset(torch.arange(10))\n"

    def test_an_unseeded_split_gets_a_seeded_generator_that_every_process_draws_alike(self):
        result = assert_codemod(
            [SameSplitOnEveryRank],
            self.SPLIT + "train, val = random_split(ds, [8, 2])\n",
            self.SPLIT + "train, val = random_split(ds, [8, 2], generator=torch.Generator().manual_seed(0))\n",
        )
        assert [(c.line, c.transform) for c in result.changes] == [(4, "split")]
        import torch

        splits = []
        for process_seed in (1, 2):  # two ranks, each with its own unseeded global generator state
            torch.manual_seed(process_seed)
            namespace: dict = {}
            exec(result.output, namespace)
            splits.append(list(namespace["train"].indices))
        assert splits[0] == splits[1]

    def test_a_split_with_a_generator_or_after_a_seed_is_left_alone(self):
        for code in ("train, val = random_split(ds, [8, 2], torch.Generator())\n",
                     "torch.manual_seed(3)\ntrain, val = random_split(ds, [8, 2])\n"):
            assert_codemod([SameSplitOnEveryRank], self.SPLIT + code, self.SPLIT + code)


class TestSamplers:
    def test_shuffle_seed_and_drop_last_move_into_the_sampler_and_set_epoch_runs_every_epoch(self):
        result = assert_codemod(
            [DistributedSamplers],
            loader_script(
                "loader = DataLoader(ds, batch_size=4, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(3))\n"
                "for epoch in range(2):\n    for x, y in loader:\n" + STEP
            ),
            loader_script(
                PER_GPU
                + "loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=True, seed=3, drop_last=True), "
                "drop_last=True, generator=torch.Generator().manual_seed(3))\n"
                "for epoch in range(2):\n    loader.sampler.set_epoch(epoch)\n    for x, y in loader:\n" + STEP,
                sampler_import=True,
            ),
        )
        assert [(c.line, c.transform) for c in result.changes] == [(8, "sampler"), (9, "sampler")]

    def test_an_unshuffled_loader_gets_an_unshuffled_sampler_and_no_set_epoch(self):
        assert_codemod(
            [DistributedSamplers],
            loader_script("loader = DataLoader(ds, batch_size=4)\nfor epoch in range(2):\n    for x, y in loader:\n" + STEP),
            loader_script(
                PER_GPU + "loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=False))\n"
                "for epoch in range(2):\n    for x, y in loader:\n" + STEP,
                sampler_import=True,
            ),
        )

    def test_an_epoch_loop_on_one_line_is_spread_out_for_set_epoch(self):
        helper = "loader = DataLoader(ds, batch_size=4{})\n\n\ndef train():\n    for x, y in loader:\n" + STEP + "\n\n"
        assert_codemod(
            [DistributedSamplers],
            loader_script(helper.format(", shuffle=True") + "for epoch in range(2): train()\n"),
            loader_script(
                PER_GPU + helper.format(", sampler=DistributedSampler(ds, shuffle=True)")
                + "for epoch in range(2):\n    loader.sampler.set_epoch(epoch)\n    train()\n",
                sampler_import=True,
            ),
        )

    def test_a_loader_built_inside_the_epoch_loop(self):
        assert_codemod(
            [DistributedSamplers],
            loader_script(
                "for epoch in range(2):\n"
                "    subset = Subset(ds, range(8 * (epoch + 1)))\n"
                "    loader = DataLoader(subset, batch_size=4, shuffle=True)\n"
                "    for x, y in loader:\n" + STEP
            ),
            loader_script(
                "for epoch in range(2):\n"
                "    subset = Subset(ds, range(8 * (epoch + 1)))\n"
                "    " + PER_GPU
                + "    loader = DataLoader(subset, batch_size=4, sampler=DistributedSampler(subset, shuffle=True))\n"
                "    loader.sampler.set_epoch(epoch)\n"
                "    for x, y in loader:\n" + STEP,
                sampler_import=True,
            ),
        )

    def test_a_loader_from_a_helper(self):
        assert_codemod(
            [DistributedSamplers],
            loader_script(
                "\n\ndef make_loader(dataset, batch_size):\n"
                "    return DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True)\n\n\n"
                "train_loader = make_loader(ds, 4)\n"
                "for epoch in range(2):\n    for x, y in train_loader:\n" + STEP
            ),
            loader_script(
                "\n\ndef make_loader(dataset, batch_size):\n"
                "    " + PER_GPU
                + "    return DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset, shuffle=True, drop_last=True), "
                "drop_last=True)\n\n\n"
                "train_loader = make_loader(ds, 4)\n"
                "for epoch in range(2):\n    train_loader.sampler.set_epoch(epoch)\n    for x, y in train_loader:\n" + STEP,
                sampler_import=True,
            ),
        )

    def test_evaluation_loaders_that_sum_nothing_are_left_whole_and_advised(self):
        tail = (
            "    with torch.no_grad():\n"
            "        for x, y in val_loader:\n"
            "            print(model(x).sum())\n"
        )
        result = assert_codemod(
            [DistributedSamplers, EvaluationSharding],
            loader_script(
                "loader = DataLoader(ds, batch_size=4, shuffle=True)\nval_loader = DataLoader(ds, batch_size=8)\n"
                "for epoch in range(2):\n    for x, y in loader:\n" + STEP + tail
            ),
            loader_script(
                PER_GPU + "loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=True))\n"
                "val_loader = DataLoader(ds, batch_size=8)\n"
                "for epoch in range(2):\n    loader.sampler.set_epoch(epoch)\n    for x, y in loader:\n" + STEP + tail,
                sampler_import=True,
            ),
        )
        whole = [a for a in result.advice if "evaluation left on the whole set" in a.message]
        assert [a.line for a in whole] == [17]
        assert "computes nothing the codemod can sum" in whole[0].message

    def test_a_dataset_expression_is_built_once(self):
        result = run_pipeline(
            loader_script(
                "loader = DataLoader(TensorDataset(torch.randn(16, 2), torch.randn(16, 1)), batch_size=4, shuffle=True)\n"
                "for epoch in range(2):\n    for x, y in loader:\n" + STEP
            ),
            "snippet.py", [DistributedSamplers], Options(),
        )
        assert "sampler=DistributedSampler(" in result.output
        assert result.output.count("torch.randn(16, 2)") == 2  # `ds = ...` in the script head, and the loader's

    def test_a_loader_with_its_own_sampler_is_left_incomplete(self):
        code = loader_script(
            "loader = DataLoader(ds, batch_size=4, sampler=torch.utils.data.RandomSampler(ds))\n"
            "for epoch in range(2):\n    for x, y in loader:\n" + STEP
        )
        result = assert_codemod([DistributedSamplers], code, code)
        assert result.status is Status.INCOMPLETE and "own sampler" in result.missing[0].what

    def test_a_loader_drawn_with_next_is_sharded_and_a_restart_moves_to_the_next_epoch(self):
        step = textwrap.indent(textwrap.dedent(STEP), "    ")
        draw = "    try:\n        x, y = next(it)\n    except StopIteration:\n{restart}        it = iter(loader)\n        x, y = next(it)\n"
        before = "loader = DataLoader(ds, batch_size=4, shuffle=True)\nit = iter(loader)\nfor step in range(8):\n"
        after = PER_GPU + "loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=True))\nit = iter(loader)\nfor step in range(8):\n"
        restart = "        loader.sampler.set_epoch(loader.sampler.epoch + 1)  # a new pass: reshuffle\n"
        result = assert_codemod([DistributedSamplers], loader_script(before + draw.format(restart="") + step),
                                loader_script(after + draw.format(restart=restart) + step, sampler_import=True))
        assert result.status is Status.CONVERTED

    def test_passes_in_straight_line_code_are_numbered_and_one_pass_needs_none(self):
        one_pass = "loader = DataLoader(ds, batch_size=4, shuffle=True)\nfor x, y in loader:\n" + textwrap.indent(textwrap.dedent(STEP), "    ")
        result = assert_codemod([DistributedSamplers], loader_script(one_pass), loader_script(
            PER_GPU + one_pass.replace("shuffle=True", "sampler=DistributedSampler(ds, shuffle=True)"), sampler_import=True))
        assert result.status is Status.CONVERTED
        peeked = one_pass.replace("\nfor x, y", "\nfirst = next(iter(loader))\nfor x, y")  # that peek was the first pass
        result = run_pipeline(loader_script(peeked), "snippet.py", [DistributedSamplers], Options())
        assert result.status is Status.CONVERTED
        assert "first = next(iter(loader))\nloader.sampler.set_epoch(1)  # pass 2 over it: reshuffle\nfor x, y" in result.output
        looped = one_pass.replace("\nfor x, y", "\nfor _ in range(2):\n    first = next(iter(loader))\nfor x, y")  # passes in a loop
        result = run_pipeline(loader_script(looped), "snippet.py", [DistributedSamplers], Options())
        assert result.status is Status.INCOMPLETE and "never told the epoch" in result.missing[0].what

    def test_a_loader_only_peeked_at_with_next_iter_is_advised(self):
        code = loader_script(
            "loader = DataLoader(ds, batch_size=4)\nprint(next(iter(loader))[0].shape)\n"
            "for epoch in range(2):\n    for x, y in ds:\n" + STEP
        )
        result = assert_codemod([DistributedSamplers], code, code)
        assert any("not iterated by a for loop" in m for m in messages(result))

    def test_global_batch_size_is_divided_by_the_world_size(self):
        result = assert_codemod(
            [DistributedSamplers],
            loader_script(
                "BATCH = 8\nloader = DataLoader(ds, batch_size=BATCH * 2, shuffle=True)\n"
                "for epoch in range(2):\n    for x, y in loader:\n" + STEP
            ),
            loader_script(
                "BATCH = 8\n# ddpify: the global batch is split over WORLD_SIZE processes.\n"
                "loader = DataLoader(ds, batch_size=(BATCH * 2) // WORLD_SIZE, sampler=DistributedSampler(ds, shuffle=True))\n"
                "for epoch in range(2):\n    loader.sampler.set_epoch(epoch)\n    for x, y in loader:\n" + STEP,
                sampler_import=True,
            ),
            batch_size="global",
        )
        assert any("batch_size // WORLD_SIZE" in c.message for c in result.changes)

    def test_an_epoch_while_loop_gets_set_epoch_or_advice(self):
        result = run_pipeline(
            loader_script(
                "loader = DataLoader(ds, batch_size=4, shuffle=True)\nepoch = 0\nwhile epoch < 2:\n"
                "    for x, y in loader:\n" + STEP + "    epoch += 1\n"
            ),
            "snippet.py", [DistributedSamplers], Options(),
        )
        assert "sampler=DistributedSampler(ds, shuffle=True)" in result.output
        assert "set_epoch(" in result.output or any("set_epoch" in m for m in messages(result))

    def test_a_helper_shared_by_train_and_eval_loaders_is_not_silently_sharded_for_eval(self):
        result = run_pipeline(
            loader_script(
                "\n\ndef make_loader(dataset, shuffle):\n    return DataLoader(dataset, batch_size=4, shuffle=shuffle)\n\n\n"
                "train_loader = make_loader(ds, True)\nval_loader = make_loader(ds, False)\n"
                "for epoch in range(2):\n    for x, y in train_loader:\n" + STEP
                + "    with torch.no_grad():\n        print(sum(model(x).sum() for x, y in val_loader))\n"
            ),
            "snippet.py", [DistributedSamplers], Options(),
        )
        assert "DistributedSampler(" not in result.output or any("evaluation" in m for m in messages(result))


# ===== rank 0 ==================================================================================
WANDB_SCRIPT = """\
    import json
    import torch
    import wandb
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        run = wandb.init(project="demo")
        wandb.config.update({"lr": 0.1})
        model = nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
        losses = []
        for epoch in range(2):
            for x, y in DataLoader(data, batch_size=4, shuffle=True):
                loss = (model(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                wandb.log({"loss": loss.item()})
                losses.append(loss.item())
        json.dump({"losses": losses}, open("metrics.json", "w"))
        run.finish()


    if __name__ == "__main__":
        main()
    """


WRITER_READ_ELSEWHERE = """\
    import os
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.tensorboard import SummaryWriter


    class Reporter:
        def __init__(self, writer):
            self.writer = writer

        def step(self, loss, step):
            self.writer.add_scalar("loss", loss, step)


    def save(model, writer):
        torch.save(model.state_dict(), os.path.join(writer.log_dir, "model.pt"))


    def main():
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        writer = SummaryWriter()
        reporter = Reporter(writer)
        data = TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
        for epoch in range(2):
            for step, (x, y) in enumerate(DataLoader(data, batch_size=4, shuffle=True)):
                loss = (model(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                reporter.step(loss.item(), step)
        save(model, writer)


    if __name__ == "__main__":
        main()
    """


def only_on_rank_zero(code: str, callee: str) -> bool:
    """Every call to `callee` in `code` sits under `if RANK == 0:` (or `... if RANK == 0 else ...`)."""
    tree = ast.parse(code)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == callee]
    assert calls, f"no call to {callee}"

    def guarded(node: ast.AST) -> bool:
        while node in parents:
            node, child = parents[node], node
            if isinstance(node, (ast.If, ast.IfExp)) and ast.unparse(node.test) == "RANK == 0" and child is not node.test:
                if child in (node.body if isinstance(node, ast.If) else [node.body]):
                    return True
        return False

    return all(guarded(c) for c in calls)


class TestRankZero:
    def test_prints_logs_writers_bars_saves_and_loads(self):
        result = assert_codemod(
            [RankZeroDuties],
            """\
            import logging
            import torch
            from torch.utils.tensorboard import SummaryWriter
            from tqdm import tqdm

            logger = logging.getLogger(__name__)


            def main(model, loader, verbose):
                writer = SummaryWriter("runs/x")
                for step, (x, y) in enumerate(tqdm(loader, desc="train")):
                    loss = model(x).sum()
                    # report
                    print("step", step)
                    print("loss", loss.item())
                    logger.info("loss %f", loss.item())
                    logging.warning("careful")
                    writer.add_scalar("loss", loss.item(), step)
                    loss.backward()
                bar = tqdm(range(3), disable=not verbose)
                for i in bar:
                    tqdm.write(f"{i}")
                writer.close()
                with open("config.json") as f:
                    cfg = f.read()
                torch.save(model.state_dict(), "ckpt.pt")
                state = torch.load("ckpt.pt")
                other = torch.load("ckpt.pt", map_location="cpu")
            """,
            """\
            import logging
            import torch
            from torch.utils.tensorboard import SummaryWriter
            from tqdm import tqdm

            logger = logging.getLogger(__name__)


            def main(model, loader, verbose):
                writer = SummaryWriter("runs/x") if RANK == 0 else None
                for step, (x, y) in enumerate(tqdm(loader, desc="train", disable=RANK != 0)):
                    loss = model(x).sum()
                    # report
                    if RANK == 0:
                        print("step", step)
                        print("loss", loss.item())
                        logger.info("loss %f", loss.item())
                    logging.warning("careful")
                    if RANK == 0:
                        writer.add_scalar("loss", loss.item(), step)
                    loss.backward()
                bar = tqdm(range(3), disable=(not verbose) or RANK != 0)
                for i in bar:
                    if RANK == 0:
                        tqdm.write(f"{i}")
                if RANK == 0:
                    writer.close()
                with open("config.json") as f:
                    cfg = f.read()
                if RANK == 0:
                    torch.save(model.state_dict(), "ckpt.pt")
                dist.barrier()  # the file rank 0 saved is read below
                state = torch.load("ckpt.pt", map_location=RANK_DEVICE)
                other = torch.load("ckpt.pt", map_location="cpu")
            """,
        )
        kinds = [c.message for c in result.changes]
        assert "print on rank 0 only" in kinds and "logging on rank 0 only" in kinds and "tensorboard/wandb on rank 0 only" in kinds

    def test_a_file_saved_in_a_helper_and_read_by_its_caller_gets_a_barrier_after_the_call(self):
        assert_codemod(
            [RankZeroDuties],
            """\
            import torch


            def pretrain(model, path):
                torch.save(model.state_dict(), path)


            def main(model):
                pretrain(model, "pre.pt")
                model.load_state_dict(torch.load("pre.pt"))
            """,
            """\
            import torch


            def pretrain(model, path):
                if RANK == 0:
                    torch.save(model.state_dict(), path)


            def main(model):
                pretrain(model, "pre.pt")
                dist.barrier()  # the file rank 0 saved is read below
                model.load_state_dict(torch.load("pre.pt", map_location=RANK_DEVICE))
            """,
        )

    def test_a_save_never_read_back_needs_no_barrier(self):
        result = assert_codemod(
            [RankZeroDuties],
            """\
            import torch


            def main(model):
                torch.save(model.state_dict(), "m.pt")
                return 1
            """,
            """\
            import torch


            def main(model):
                if RANK == 0:
                    torch.save(model.state_dict(), "m.pt")
                return 1
            """,
        )
        assert "barrier" not in result.output

    def test_files_opened_for_writing(self):
        assert_codemod(
            [RankZeroDuties],
            """\
            import torch

            LOG = "log.txt"
            with open(LOG, "w") as f:
                f.write("start\\n")
            with open(LOG, mode="a") as f:
                f.write("more\\n")
            with open(LOG) as f:
                text = f.read()
            """,
            """\
            import torch

            LOG = "log.txt"
            if RANK == 0:
                with open(LOG, "w") as f:
                    f.write("start\\n")
                with open(LOG, mode="a") as f:
                    f.write("more\\n")
            with open(LOG) as f:
                text = f.read()
            """,
        )

    def test_a_file_opened_by_assignment(self):
        assert_codemod(
            [RankZeroDuties],
            """\
            import torch

            f = open("log.txt", "a")
            f.write("saved\\n")
            f.close()
            x = 1
            """,
            """\
            import torch

            if RANK == 0:
                f = open("log.txt", "a")
                f.write("saved\\n")
                f.close()
            x = 1
            """,
        )

    def test_a_with_block_and_an_assigned_file_of_the_same_name_are_guarded_once(self):
        assert_codemod(
            [RankZeroDuties],
            """\
            import torch


            def main():
                with open("log.txt", "a") as f:
                    f.write("start\\n")
                f = open("log.txt", "a")
                f.write("x")
                f.close()
            """,
            """\
            import torch


            def main():
                if RANK == 0:
                    with open("log.txt", "a") as f:
                        f.write("start\\n")
                    f = open("log.txt", "a")
                    f.write("x")
                    f.close()
            """,
        )

    def test_wandb_calls_are_rank_zero(self):
        output = convert_source(textwrap.dedent(WANDB_SCRIPT), "ddp").output
        assert only_on_rank_zero(output, "wandb.log") and only_on_rank_zero(output, "run.finish")
        assert not only_on_rank_zero(output, "losses.append")
        assert not only_on_rank_zero(output, "wandb.config.update")  # the config every rank reads

    def test_every_rank_starts_the_wandb_run_disabled_off_rank_zero(self):
        """tests/test_wandb_ranks.py runs it: wandb's module state is unusable where init never ran."""
        output = convert_source(textwrap.dedent(WANDB_SCRIPT), "ddp").output
        assert 'run = wandb.init(project="demo", mode=None if RANK == 0 else "disabled")' in output
        assert not only_on_rank_zero(output, "wandb.init") and "RankZeroStandIn" not in output

    def test_attributes_read_of_a_writer_anywhere_are_broadcast_from_rank_zero(self):
        output = convert_source(textwrap.dedent(WRITER_READ_ELSEWHERE), "ddp").output
        assert 'writer = shared_from_rank_zero(SummaryWriter() if RANK == 0 else None, "log_dir")' in one_line(output)
        assert 'os.path.join(writer.log_dir, "model.pt")' in output and "self.writer.add_scalar" in output
        assert "class RankZeroStandIn:" in output and "def shared_from_rank_zero(built, *attributes):" in output

    def test_the_stand_in_takes_any_call_and_keeps_the_attributes_it_was_given(self):
        from ddpify.codemods.ddp.rank_zero import STAND_IN, STAND_IN_HELPER

        namespace: dict = {}
        exec(STAND_IN_HELPER, namespace)
        run = namespace[STAND_IN](dir="wandb/run-1")
        assert run.config.update({"lr": 0.1}) is None and run.log({"loss": 1.0}, step=3) is None
        assert run.dir == "wandb/run-1"
        with run as entered:
            assert entered is run
        with pytest.raises(AttributeError):
            run.__deepcopy__

    def test_a_file_opened_inside_an_expression_is_written_on_rank_zero_only(self):
        output = convert_source(textwrap.dedent(WANDB_SCRIPT), "ddp").output
        assert only_on_rank_zero(output, "json.dump")

    def test_print_inside_an_expression_is_not_guarded(self):
        code = "import torch\nok = print('x') or True\n"
        assert_codemod([RankZeroDuties], code, code)


    def test_work_every_rank_joins_is_hoisted_out_of_a_print(self):
        result = assert_codemod(
            [RankZeroDuties],
            joined(EVALUATED_HEAD, """\
            def main(model):
                evaluate_result = None
                # report
                print(f"acc {evaluate(model):.4f} then {len(str(evaluate(model)))}")
                logger.info("acc %s", evaluate(model))
            """),
            joined(EVALUATED_HEAD, """\
            def main(model):
                evaluate_result = None
                # report
                evaluate_result1 = evaluate(model)
                evaluate_result2 = evaluate(model)
                if RANK == 0:
                    print(f"acc {evaluate_result1:.4f} then {len(str(evaluate_result2))}")
                evaluate_result3 = evaluate(model)
                if RANK == 0:
                    logger.info("acc %s", evaluate_result3)
            """),
        )
        assert not messages(result)

    def test_the_conditional_or_repeated_part_around_work_is_computed_whole(self):
        assert_codemod(
            [RankZeroDuties],
            joined(EVALUATED_HEAD, """\
            def main(model, models, full, step, x):
                print(evaluate(model) if full else 0)
                print([evaluate(m) for m in models], len(x), x.item())
                print(sorted(models, key=lambda m: evaluate(m)))
                if step % 10 == 0: logger.info("best %s", max(evaluate(m) for m in models))
            """),
            joined(EVALUATED_HEAD, """\
            def main(model, models, full, step, x):
                evaluate_result = evaluate(model) if full else 0
                if RANK == 0:
                    print(evaluate_result)
                evaluate_results = [evaluate(m) for m in models]
                if RANK == 0:
                    print(evaluate_results, len(x), x.item())
                evaluate_result1 = sorted(models, key=lambda m: evaluate(m))
                if RANK == 0:
                    print(evaluate_result1)
                if step % 10 == 0:
                    evaluate_result2 = max(evaluate(m) for m in models)
                    if RANK == 0:
                        logger.info("best %s", evaluate_result2)
            """),
        )

    def test_work_the_output_itself_consumes_stays_on_every_rank(self):
        code = joined(EVALUATED_HEAD, "def main(models):\n    print(*(evaluate(m) for m in models))\n")
        result = assert_codemod([RankZeroDuties], code, code)
        assert messages(result) == ["print left on every rank: `evaluate(m)` must run on every rank and sits in a "
                                    "comprehension; compute on every rank and output on rank 0 by hand"]

    def test_a_call_of_unknown_work_runs_on_every_rank_and_pure_formatting_stays(self):
        assert_codemod(
            [RankZeroDuties],
            """\
            import math
            import time
            import torch
            import metrics


            def main(loss, start, scheduler):
                print(f"loss {loss.item():.4f} ppl {math.exp(loss.item()):.1f} {time.time() - start:.0f}s lr {scheduler.get_last_lr()[0]}")
                print(f"f1 {metrics.f1_score(loss):.3f} {str(round(loss.item(), 2)).rjust(6)}")
            """,
            """\
            import math
            import time
            import torch
            import metrics


            def main(loss, start, scheduler):
                if RANK == 0:
                    print(f"loss {loss.item():.4f} ppl {math.exp(loss.item()):.1f} {time.time() - start:.0f}s lr {scheduler.get_last_lr()[0]}")
                f1_score_result = metrics.f1_score(loss)
                if RANK == 0:
                    print(f"f1 {f1_score_result:.3f} {str(round(loss.item(), 2)).rjust(6)}")
            """,
        )


EVALUATED_HEAD = """\
import logging
import torch.distributed as dist

logger = logging.getLogger(__name__)


def evaluate(model):
    total = model.sum()
    dist.all_reduce(total)
    return total.item()

"""


# ===== noise ===================================================================================
class TestNoiseOfEachRank:
    SCRIPT = """\
    import torch
    from torch.utils.data import DataLoader, Dataset

    SEED


    class Noisy(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.rand(2)


    class Generator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x + torch.randn_like(x))


    model = Generator()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in DataLoader(Noisy(), batch_size=2):
        noise = torch.randn(x.shape[0], 2)
        model(x + noise).sum().backward()
        opt.step()
    """

    def advice(self, seed: str) -> list[tuple[int, str]]:
        code = textwrap.dedent(self.SCRIPT).replace("SEED", seed)
        result = run_pipeline(code, "snippet.py", [NoiseOfEachRank], Options())
        return [(a.line, a.message.split(":")[0]) for a in result.advice]

    def test_draws_in_the_training_step_and_the_forward_of_a_script_seeded_once_are_advised(self):
        same = "every rank draws the same values here (the global RNG is seeded alike on every rank)"
        assert self.advice("torch.manual_seed(0)") == [(21, same), (27, same)]  # in the model's forward too

    def test_no_advice_without_a_seed_or_with_a_seed_per_rank(self):
        assert self.advice("import os") == []
        assert self.advice("torch.manual_seed(int(os.environ['RANK']))") == []

    def test_a_draw_in_a_model_method_counts_too(self):
        code = textwrap.dedent(self.SCRIPT).replace("SEED", "torch.manual_seed(0)").replace("    noise = torch.randn(x.shape[0], 2)\n", "    noise = 0\n")
        result = run_pipeline(code, "snippet.py", [NoiseOfEachRank], Options())
        assert [a.line for a in result.advice] == [21]

    def test_a_converted_script_is_reseeded_with_the_rank_just_before_training(self):
        code = textwrap.dedent(self.SCRIPT).replace("SEED", "torch.manual_seed(0)")
        output = convert_source(code, "ddp").output
        lines = output.splitlines()
        reseed = lines.index("torch.manual_seed(0 + RANK)")
        after = next(line for line in lines[reseed + 1:] if not line.startswith("#"))
        assert after.startswith("for x in DataLoader(") and "model = DDP(" in "\n".join(lines[:reseed])
        assert output.count("manual_seed(0 + RANK)") == 1


# ===== no_sync =================================================================================
ACCUM_HEAD = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(16, 2), torch.randn(16, 1)), batch_size=2)
model = DDP(torch.nn.Linear(2, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""


class TestNoSync:
    def test_accumulation_micro_steps_skip_the_all_reduce(self):
        result = assert_codemod(
            [NoSyncAccumulation],
            ACCUM_HEAD + """\
accum = 4
for epoch in range(2):
    for i, (x, y) in enumerate(loader):
        # forward
        out = model(x)
        loss = (out - y).pow(2).mean() / accum
        loss.backward()
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
""",
            ACCUM_HEAD.replace("import torch\n", "import torch\n", 1).replace(
                "from torch.utils.data import DataLoader, TensorDataset\n",
                "from torch.utils.data import DataLoader, TensorDataset\nimport contextlib\n",
            ) + """\
accum = 4
for epoch in range(2):
    for i, (x, y) in enumerate(loader):
        # forward
        with model.no_sync() if not ((i + 1) % accum == 0) else contextlib.nullcontext():
            out = model(x)
            loss = (out - y).pow(2).mean() / accum
            loss.backward()
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
""",
        )
        assert [(c.line, c.transform) for c in result.changes] == [(12, "no_sync")]

    def test_a_step_every_iteration_needs_no_no_sync(self):
        code = ACCUM_HEAD + """\
for epoch in range(2):
    for x, y in loader:
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
"""
        result = assert_codemod([NoSyncAccumulation], code, code)
        assert not result.advice

    def test_a_condition_on_the_micro_steps_results_is_only_advised(self):
        code = ACCUM_HEAD + """\
seen = 0
for epoch in range(2):
    for x, y in loader:
        loss = (model(x) - y).pow(2).mean()
        seen = seen + len(x)
        loss.backward()
        if seen >= 8:
            opt.step()
            opt.zero_grad()
            seen = 0
"""
        result = assert_codemod([NoSyncAccumulation], code, code)
        assert any("no_sync by hand" in m for m in messages(result))


# ===== imports, and files to leave alone =======================================================
class TestWholeConversions:
    ALIASED = """\
        import torch
        {imports}

        ds = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
        net = nn.Linear(2, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        dl = {loader}(ds, batch_size=4, shuffle=True)
        for epoch in range(2):
            for x, y in dl:
                loss = (net(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            print(epoch, loss.item())
        """

    @pytest.mark.parametrize(
        "imports, loader",
        [
            ("import torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset", "DataLoader"),
            ("from torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset", "DataLoader"),
            ("from torch import nn\nfrom torch.utils.data import DataLoader as DL, TensorDataset", "DL"),
            ("import torch.nn as nn\nimport torch.utils.data as tud\nfrom torch.utils.data import TensorDataset", "tud.DataLoader"),
        ],
        ids=["import-as", "from-import", "loader-alias", "module-alias"],
    )
    def test_aliased_imports(self, imports: str, loader: str):
        source = textwrap.dedent(self.ALIASED).format(imports=imports, loader=loader)
        result = convert_source(source, "ddp")
        out = result.output
        assert f"net = {WRAP.replace('model', 'net')}\n" in one_line(out)
        assert f"dl = {loader}(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=True))" in one_line(out)
        assert "    dl.sampler.set_epoch(epoch)\n" in out
        assert "    if RANK == 0:\n        print(epoch, loss.item())\n" in out
        assert out.rstrip().endswith("cleanup_distributed()")
        compile(out, "converted.py", "exec")
        assert convert_source(out, "ddp").output == out

    def test_a_file_without_torch_is_left_alone(self):
        source = "import numpy as np\n\nprint(np.zeros(3))\n"
        result = convert_source(source, "ddp")
        assert result.output == source and not result.changed and not result.changes
        assert result.note == "does not use torch"

    def test_a_dataparallel_script_is_not_wrapped_twice(self):
        source = textwrap.dedent("""\
            import torch
            from torch import nn
            from torch.utils.data import DataLoader, TensorDataset

            model = nn.DataParallel(nn.Linear(2, 1)).to("cuda" if torch.cuda.is_available() else "cpu")
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(2):
                for x, y in DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4, shuffle=True):
                    loss = (model(x) - y).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            torch.save(model.module.state_dict(), "m.pt")
            """)
        result = convert_source(source, "ddp")
        assert "DDP(" in result.output
        assert "DataParallel(" not in result.output.replace("DistributedDataParallel", "")

    def test_an_already_distributed_file_is_left_alone(self):
        source = textwrap.dedent("""\
            import os
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            dist.init_process_group("gloo")
            model = DDP(torch.nn.Linear(2, 1))
            print(os.environ["RANK"])
            """)
        result = convert_source(source, "ddp")
        assert result.output == source and not result.changes
        assert "already distributed" in result.note

    def test_the_transforms_change_nothing_on_a_script_without_training(self):
        source = "import torch\n\nx = torch.ones(2)\ny = x * 2\n"
        result = run_pipeline(source, "snippet.py", [RankDevices, WrapModel, DDPModuleAccess, DistributedSamplers,
                                                    RankZeroDuties, NoSyncAccumulation], Options())
        assert result.output == source


def test_a_download_runs_on_rank_zero_first_then_on_each_nodes_local_rank_zero():
    out = convert_source(textwrap.dedent("""
        import torch
        from torchvision import datasets

        def main():
            train = datasets.MNIST("data", train=True, download=True)
            model = torch.nn.Linear(784, 10)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in torch.utils.data.DataLoader(train, batch_size=8):
                optimizer.zero_grad()
                model(x.flatten(1)).sum().backward()
                optimizer.step()

        if __name__ == "__main__":
            main()
    """), "ddp").output
    lines = [line.strip() for line in out.splitlines()]
    at = lines.index('train = datasets.MNIST("data", train=True, download=True)')
    assert lines[at - 4:at] == ["if RANK != 0:", "dist.barrier()  # rank 0 downloads first",
                                "if LOCAL_RANK != 0:", "dist.barrier()  # then each node's local rank 0 (its own disk)"]
    assert lines[at + 1:at + 5] == ["if RANK == 0:", "dist.barrier()  # other nodes find the files on a shared disk",
                                    "if LOCAL_RANK == 0:", "dist.barrier()  # the node's other ranks now find the files"]


@pytest.mark.parametrize(("code", "expected"), [
    ("model = Net().to(device)\nopt = SGD(model.parameters())\nprint(model.vocab)\n", True),
    ("model = Net().to(device)\nopt = SGD(model.parameters())\ntorch.save(model.state_dict(), 'm.pt')\n", True),
    ("def build():\n    return Net()\nmodel = build()\nopt = SGD(model.parameters())\nmodel.generate()\n", True),
    ("model = Net().to(device)\nopt = SGD(model.parameters())\nout = model(x)\nmodel.train()\n", False),
])
def test_module_access_is_planned_only_where_a_model_is_read_through_what_its_wrapper_lacks(code, expected):
    """Judged before the wrap (in the wrap's own stage), so most scripts need no stage after the wrap for it."""
    anatomy = analyze("import torch\nfrom torch.optim import SGD\nfrom net import Net\n" + code)
    assert DDPModuleAccess.finds_work(anatomy, Options()) is expected
