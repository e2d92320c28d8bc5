"""Shapes real scripts take (issue 10 §3 items 1, 2, 6, 7, 8): the transforms on snippets, before/after,
and every `fixtures/real/shape_*.py` converted, linted, run under torchrun and verified.

Snippet tests use `assert_codemod` from test_ddp_transforms.py. The execution tests convert each
shape fixture into a temporary directory, lint the output with ddpify's own rules, run it with
2 ranks (gloo, CPU) and check that it logs once and trains as the original (`ddpify verify`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpify.anatomy import analyze
from ddpify.cli import cli
from ddpify.codemods.ddp import DistributedSetup, RankDevices, RemoveDataParallel, WrapModel
from ddpify.codemods.ddp.runtime import RELEASE_COMMENT
from ddpify.codemods.ddp.wrap import GRADIENT_VIEWS, option_comments
from ddpify.codemods.options import Options
from ddpify.codemods.pipeline import run_pipeline
from ddpify.convert import convert_source

try:
    from helpers import FIXTURES_DIR, REPO_ROOT, failure_report, run_ddpify, run_script
    from test_ddp_transforms import HELPERS, assert_codemod, joined, messages
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import FIXTURES_DIR, REPO_ROOT, failure_report, run_ddpify, run_script
    from test_ddp_transforms import HELPERS, assert_codemod, joined, messages

SHAPES = sorted((FIXTURES_DIR / "real").glob("shape_*.py"))
ALREADY_DISTRIBUTED = sorted((Path(__file__).parent / "data" / "already_distributed").glob("*.py"))
TIMEOUT = 180
WRAP = "DDP({0}, device_ids=[LOCAL_RANK] if next({0}.parameters()).is_cuda else None)"  # each model of a dict or list


def wrap(name: str, indent: str = "") -> str:
    """The statements that wrap the one model `name`: the comment of its option, then the wrap with gradients
    as bucket views."""
    option, _ = GRADIENT_VIEWS
    return textwrap.indent(option_comments(GRADIENT_VIEWS), indent) + f"{indent}{name} = {WRAP.format(name)[:-1]}, {option})\n"


def wrap_line(name: str) -> str:
    """The wrap statement alone, as ast.unparse writes it."""
    return wrap(name).splitlines()[-1]


DDP_IMPORT = "from torch.nn.parallel import DistributedDataParallel as DDP\n"


# ===== 6: GPU indices held in variables =========================================================
class TestGpuIndexVariables:
    def test_indices_in_variables_become_local_rank(self):
        result = assert_codemod(
            [RankDevices],
            """\
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--gpu", type=int, default=0)
            args = parser.parse_args()
            gpu = 0
            torch.cuda.set_device(gpu)
            m = torch.nn.Linear(2, 2).cuda(gpu)
            d = torch.device(f"cuda:{args.gpu}")
            e = torch.device("cuda", args.gpu)
            x = torch.zeros(2).to(args.gpu)
            y = torch.zeros(2).to(gpu)
            """,
            """\
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--gpu", type=int, default=0)
            args = parser.parse_args()
            gpu = 0
            torch.cuda.set_device(LOCAL_RANK)
            m = torch.nn.Linear(2, 2).cuda(LOCAL_RANK)
            d = torch.device(f"cuda:{LOCAL_RANK}")
            e = torch.device("cuda", LOCAL_RANK)
            x = torch.zeros(2).to(LOCAL_RANK)
            y = torch.zeros(2).to(LOCAL_RANK)
            """,
        )
        assert sorted(c.line for c in result.changes) == [7, 8, 9, 10, 11, 12]

    def test_an_index_on_self_set_from_a_callers_literal(self):
        before = """\
            import torch


            class Trainer:
                def __init__(self, gpu_id):
                    self.gpu_id = gpu_id

                def put(self, x):
                    return x.to(self.gpu_id)


            Trainer(0).put(torch.ones(1))
            """
        assert_codemod([RankDevices], before, before.replace("x.to(self.gpu_id)", "x.to(LOCAL_RANK)"))

    def test_devices_and_dtypes_in_variables_are_left_alone(self):
        code = """\
            import torch
            device = torch.device("cuda")
            dtype = torch.float16
            name = "model"
            x = torch.zeros(2).to(device).to(dtype)
            print(f"{name}:{device}")
            """
        result = assert_codemod([RankDevices], code, code)
        assert not result.changes


# ===== 2: module-level code that needs the process group ========================================
class TestModuleLevelGroup:
    SCRIPT = """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4, shuffle=True)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)


        def train():
            for x, y in loader:
                opt.zero_grad()
                (model(x) - y).pow(2).mean().backward()
                opt.step()


        if __name__ == "__main__":
            train()
        """

    def test_the_group_is_joined_before_module_level_training_state(self):
        body = textwrap.dedent(self.SCRIPT).split("\n", 2)[2]
        assert_codemod(
            [DistributedSetup],
            self.SCRIPT,
            joined(
                """\
                import torch
                from torch.utils.data import DataLoader, TensorDataset
                import gc
                import os
                import torch.distributed as dist
                """,
                HELPERS,
                "setup_distributed()\n",
                body.replace("    train()\n", "    try:\n        train()\n" + textwrap.indent(RELEASE_COMMENT, " " * 8) + "        del model\n"
                                               "    finally:\n        cleanup_distributed()\n"),
            ),
        )

    def test_the_converted_module_level_script_wraps_after_joining(self):
        output = convert_source(textwrap.dedent(self.SCRIPT), "ddp").output
        statements = [ast.unparse(s) for s in ast.parse(output).body]
        assert statements.index("setup_distributed()") < statements.index(wrap_line("model"))

    def test_training_inside_main_still_joins_in_main(self):
        code = "import torch\n\n\nif __name__ == '__main__':\n    torch.ones(1)\n"
        output = run_pipeline(code, "snippet.py", [DistributedSetup], Options()).output
        assert "if __name__ == '__main__':\n    setup_distributed()\n" in output


# ===== 1: which models are trained =============================================================
TRAIN_LOOP = """\
    for x, y in loader:
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
"""


class TestTrainedModels:
    def test_param_groups_built_in_a_helper_from_layers(self):
        before = """\
            import torch
            from torch import nn


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body, self.head = nn.Linear(2, 2), nn.Linear(2, 1)


            def build(model):
                groups = [{"params": model.body.parameters()}, {"params": model.head.parameters(), "lr": 1.0}]
                return torch.optim.SGD(groups, lr=0.1)


            def main(loader, device):
                model = Net().to(device)
                opt = build(model)
            """
        before = textwrap.dedent(before)
        after = before.replace("from torch import nn\n", "from torch import nn\n" + DDP_IMPORT).replace(
            "    model = Net().to(device)\n", "    model = Net().to(device)\n" + wrap("model", "    ")
        )
        result = assert_codemod([WrapModel], before, after)
        assert not result.advice

    def test_param_groups_in_a_module_level_variable(self):
        source = "import torch\nmodel = torch.nn.Linear(2, 1)\ngroups = [{'params': model.parameters()}]\nopt = torch.optim.SGD(groups, lr=0.1)\n"
        assert [m.target.name for m in analyze(source).trained_models] == ["model"]

    def test_hand_written_updates_without_an_optimizer(self):
        before = "import torch\n\ndef main(loader, device):\n    model = torch.nn.Linear(2, 1).to(device)\n" + TRAIN_LOOP + (
            "        with torch.no_grad():\n"
            "            for p in model.parameters():\n"
            "                p -= 0.1 * p.grad\n"
        )
        after = before.replace("import torch\n", "import torch\n" + DDP_IMPORT, 1).replace(
            ".to(device)\n", ".to(device)\n" + wrap("model", "    ")
        )
        assert_codemod([WrapModel], before, after)

    def test_data_add_update_finds_the_model(self):
        source = "import torch\nmodel = torch.nn.Linear(2, 1)\nfor p in model.parameters():\n    p.data.add_(-0.1 * p.grad)\n"
        assert [m.target.name for m in analyze(source).trained_models] == ["model"]

    def test_a_parameter_loop_that_does_not_update_is_not_training(self):
        source = "import torch\nmodel = torch.nn.Linear(2, 1)\nfor p in model.parameters():\n    print(p.grad)\n"
        assert analyze(source).trained_models == []

    @pytest.mark.parametrize("container, literal, wrapped", [
        ("dict", '{"enc": torch.nn.Linear(2, 2), "head": torch.nn.Linear(2, 1)}',
         "{key: %s for key, net in nets.items()}" % WRAP.format("net")),
        ("list", "[torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)]", "[%s for net in nets]" % WRAP.format("net")),
    ], ids=["dict", "list"])
    def test_models_in_a_dict_or_list_are_each_wrapped(self, container, literal, wrapped):
        each = "nets.values()" if container == "dict" else "nets"
        before = f"import torch\nnets = {literal}\nopts = [torch.optim.SGD(net.parameters(), lr=0.1) for net in {each}]\n"
        after = before.replace("import torch\n", "import torch\n" + DDP_IMPORT + "\n").replace(
            f"nets = {literal}\n", f"nets = {literal}\nnets = {wrapped}\n"
        )
        result = assert_codemod([WrapModel], before, after)
        assert [c.message for c in result.changes] == ["wrapped each model in nets in DistributedDataParallel"]

    def test_dataparallel_wraps_each_model_of_a_dict_too(self):
        output = convert_source((FIXTURES_DIR / "real" / "shape_model_dict.py").read_text(), "dp").output
        assert "    nets = {key: nn.DataParallel(net) for key, net in nets.items()}\n" in output
        assert "nn.DataParallel(nets)" not in output

    def test_two_models_with_their_optimizers_are_both_wrapped(self):
        source = (FIXTURES_DIR / "real" / "shape_gan.py").read_text()
        assert sorted(m.target.name for m in analyze(source).trained_models) == ["netD", "netG"]


# ===== 7: the model reaches its device inside another object ===================================
TRAINER = """\
import torch


class Trainer:
    def __init__(self, model, opt, device):
        self.model = model.to(device)
        self.opt = opt


def main(device):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    Trainer(model, opt, device)
"""


class TestMovedInsideATrainer:
    def test_the_wrap_follows_the_move_inside_the_trainer(self):
        result = assert_codemod(
            [WrapModel],
            TRAINER,
            TRAINER.replace("import torch\n", "import torch\n" + DDP_IMPORT).replace(
                "        self.model = model.to(device)\n",
                "        self.model = model.to(device)\n" + wrap("self.model", "        "),
            ),
        )
        assert not result.advice  # the move exists: no "never moved to a GPU"

    @pytest.mark.parametrize("name", ["shape_trainer_move.py", "shape_trainer_method_optim.py"])
    def test_in_the_converted_fixture_the_wrap_runs_after_the_move(self, name):
        """CPU runs cannot show it (DDP on a CPU module with NCCL fails on GPUs only): read the order."""
        result = convert_source((FIXTURES_DIR / "real" / name).read_text(), "ddp")
        assert not [a for a in result.advice if "never moved" in a.message]
        tree = ast.parse(result.output)
        init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__"
                    and any("self.model" in ast.unparse(s) for s in n.body))
        lines = [ast.unparse(s) for s in init.body]
        move = lines.index("self.model = model.to(device)")
        wrap = lines.index(wrap_line("self.model"))
        assert move < wrap
        wraps_anywhere = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "DDP"]
        assert len(wraps_anywhere) == 1, "the model is wrapped once, inside the Trainer"

    def test_a_model_built_and_moved_by_a_helper_is_not_advised_as_never_moved(self):
        source = textwrap.dedent("""\
            import torch


            def build(device):
                model = torch.nn.Linear(2, 1)
                model.to(device)
                return model


            def main(device):
                model = build(device)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
            """)
        result = run_pipeline(source, "snippet.py", [WrapModel], Options())
        assert "    model = build(device)\n" + wrap("model", "    ") in result.output
        assert not result.advice
        unmoved = run_pipeline(source.replace("    model.to(device)\n", ""), "snippet.py", [WrapModel], Options())
        assert any("never moved to a GPU" in m for m in messages(unmoved))

    def test_a_trainer_that_does_not_move_the_model_leaves_the_wrap_where_it_is_bound(self):
        source = TRAINER.replace("model.to(device)", "model")
        [site] = analyze(source).trained_models
        assert site.target.name == "model" and site.scope == "main"


# ===== 8: DataParallel and other distribution libraries ========================================
class TestDataParallel:
    def test_a_dataparallel_rebind_is_removed(self):
        assert_codemod(
            [RemoveDataParallel],
            """\
            import torch
            model = torch.nn.Linear(2, 1)
            if torch.cuda.device_count() > 1:
                print("many GPUs")
                model = torch.nn.DataParallel(model, device_ids=[0, 1])
            if torch.cuda.device_count() > 1:
                model = torch.nn.DataParallel(model)
            """,
            """\
            import torch
            model = torch.nn.Linear(2, 1)
            if torch.cuda.device_count() > 1:
                print("many GPUs")
            if torch.cuda.device_count() > 1:
                pass
            """,
        )

    def test_an_inline_dataparallel_becomes_its_module(self):
        assert_codemod(
            [RemoveDataParallel],
            "from torch import nn\nnet = nn.DataParallel(nn.Linear(2, 1)).to('cuda')\n",
            "from torch import nn\nnet = nn.Linear(2, 1).to('cuda')\n",
        )

    def test_ddp_replaces_dataparallel_and_never_wraps_it(self):
        output = convert_source((FIXTURES_DIR / "real" / "shape_dataparallel.py").read_text(), "ddp").output
        calls = [ast.unparse(n.func) for n in ast.walk(ast.parse(output)) if isinstance(n, ast.Call)]
        assert "nn.DataParallel" not in calls and calls.count("DDP") == 1


@pytest.mark.parametrize("script", ALREADY_DISTRIBUTED, ids=[p.name for p in ALREADY_DISTRIBUTED])
def test_scripts_distributed_by_a_library_are_left_alone_and_say_why(script: Path):
    source = script.read_text()
    assert analyze(source).kind.by_a_library
    library = {"accelerate": "Accelerate", "lightning": "Lightning", "fabric": "Lightning Fabric",
               "hf": "Hugging Face Trainer", "deepspeed": "DeepSpeed"}[script.stem.split("_")[0]]
    for target in ("ddp", "dp"):
        result = convert_source(source, target, path=script.name)
        assert result.output == source and not result.changes
        assert re.fullmatch(rf"already distributed by (the )?{library} \(\S+ at line \d+\); nothing to do", result.note)


def test_an_accelerate_script_gets_no_lint_findings():
    completed = ddpify("lint", *map(str, ALREADY_DISTRIBUTED))
    assert completed.returncode == 0, completed.stdout + completed.stderr


# ===== every shape fixture: converted, linted, run under torchrun, verified =====================
def ddpify(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    """`python -m ddpify ARGS` (forked from the tests' fork server), this checkout importable."""
    return run_ddpify(args, cwd, {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))},
                      TIMEOUT)


STEP = re.compile(r"^epoch (\d+) step (\d+) ")


@pytest.mark.parametrize("script", SHAPES, ids=[p.name for p in SHAPES])
def test_shape_converts_lints_clean_runs_on_two_ranks_and_verifies(script: Path, tmp_path: Path):
    original = run_script([sys.executable, str(script)], cwd=tmp_path, timeout=TIMEOUT)
    assert original.returncode == 0, failure_report(original)
    result = convert_source(script.read_text(), "ddp", path=script.name)
    unexpected = [a.message for a in result.advice if "learning rate" not in a.message]  # LR advice: every per-gpu conversion
    assert not unexpected, unexpected
    converted = tmp_path / f"{script.stem}_ddp.py"
    converted.write_text(result.output)

    lint = CliRunner().invoke(cli, ["lint", str(converted)])
    assert lint.exit_code == 0, lint.output

    run_dir = tmp_path / "ddp"
    run_dir.mkdir()
    run = run_script([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(converted)],
                     cwd=run_dir, timeout=TIMEOUT)
    assert run.returncode == 0, failure_report(run)
    steps = [STEP.match(line).groups() for line in run.stdout.splitlines() if STEP.match(line)]
    assert steps and len(steps) == len(set(steps)), "every step is logged once (rank 0 only)"
    assert 2 * len(steps) == sum(1 for line in original.stdout.splitlines() if STEP.match(line))

    verdict = ddpify("verify", str(script), "--to", "ddp", "--steps", "4", "--json", cwd=tmp_path)
    report = json.loads(verdict.stdout)
    assert (verdict.returncode, report["verdict"]) == (0, "equivalent"), report["message"]
