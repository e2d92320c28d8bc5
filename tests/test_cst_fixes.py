"""Lint fixes built by the convert transforms' LibCST machinery: the file's own indentation and
line endings, the smallest edits, and fixes of one statement that meet over several rounds."""

from __future__ import annotations

import pytest

from ddpify.anatomy import analyze
from ddpify.edits.statements import guard
from ddpify.lint import engine
from ddpify.lint.cst_fixes import statement_edit
from ddpify.lint.engine import Options, check_text, fix_text
from ddpify.lint.fixes import apply_fixes
from ddpify.lint.rule import Edit, Fix

HEAD = (
    "import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
    "dist.init_process_group('gloo')\nrank = dist.get_rank()\nmodel = DDP(torch.nn.Linear(4, 1))\n"
)


def fixed(text: str, *codes: str) -> str:
    out, _, left, errors = fix_text(text, "t.py", engine.rule_set(frozenset(codes)), Options(fix=True, unsafe_fixes=True))
    assert not errors and not left
    return out


def test_guard_keeps_tab_indentation_and_multiline_string():
    body = "def report(loss):\n\tprint('''loss\n\t{}'''.format(loss))\n"
    assert fixed(HEAD + body, "DDP007") == HEAD + (
        "def report(loss):\n\tif dist.get_rank() == 0:\n\t\tprint('''loss\n\t{}'''.format(loss))\n"
    )


def test_guard_keeps_crlf_line_endings():
    text = (HEAD + "print(f'''model\n{model}''')\n").replace("\n", "\r\n")
    assert fixed(text, "DDP007") == (HEAD + "if rank == 0:\n    print(f'''model\n{model}''')\n").replace("\n", "\r\n")


def test_insertion_keeps_crlf_line_endings():
    text = (
        "import torch\r\nimport torch.distributed as dist\r\nfrom torch.utils.data import DataLoader, DistributedSampler\r\n\r\n"
        "dist.init_process_group('gloo')\r\nmodel = torch.nn.Linear(4, 1)\r\nopt = torch.optim.SGD(model.parameters())\r\n"
        "sampler = DistributedSampler(range(8))\r\nloader = DataLoader(range(8), sampler=sampler)\r\n"
        "for epoch in range(3):\r\n\tfor x in loader:\r\n\t\tmodel(x).sum().backward()\r\n\t\topt.step()\r\n"
    )
    assert fixed(text, "DDP003") == text.replace("range(3):\r\n", "range(3):\r\n\tsampler.set_epoch(epoch)\r\n")


def test_keyword_added_in_a_tab_indented_crlf_call_spread_over_lines():
    text = "import torch\r\nimport torch.multiprocessing as mp\r\n\r\ndef worker(rank):\r\n\tstate = torch.load(\r\n\t\t'ckpt.pt',\r\n\t)\r\n\r\nmp.spawn(worker, nprocs=2)\r\n"
    assert fixed(text, "DDP001") == text.replace("'ckpt.pt',\r\n", "'ckpt.pt',\r\n\t\tmap_location=\"cpu\",\r\n")


def test_guard_of_the_last_line_without_a_line_break():
    assert fixed(HEAD + "print('done')", "DDP007") == HEAD + "if rank == 0:\n    print('done')"


def test_statement_edit_spans_only_the_lines_that_change():
    text = HEAD + "print('''a\nb''')\n"
    a = analyze(text, "t.py")
    edit = statement_edit(a, a.tree.body[-1], lambda stmt: [guard([stmt], "rank == 0")])
    assert edit == Edit(8, 0, 9, 0, "if rank == 0:\n    print('''a\n")


def test_module_fix_is_the_smallest_insertion():
    found, _ = check_text(HEAD + "torch.save(model.state_dict(), f'ckpt{rank}.pt')\n", "t.py", engine.rule_set(frozenset({"DDP008"})))
    assert found[0].fix.edits == (Edit(8, 16, 8, 16, ".module"),)


def test_fixes_of_one_statement_meet_over_rounds():
    """DDP006's guard rewrites the line DDP008 inserts `.module` into: one per round, both applied."""
    text = HEAD + "torch.save(model.state_dict(), 'model.pt')\n"
    assert fixed(text, "DDP006", "DDP008") == HEAD + "if rank == 0:\n    torch.save(model.module.state_dict(), 'model.pt')\n"


def test_an_insertion_inside_a_replaced_range_overlaps_it():
    fixes = [Fix((Edit(1, 0, 1, 6, "XYZ"),), True, "replace"), Fix((Edit(1, 3, 1, 3, "!"),), True, "insert inside")]
    assert apply_fixes("abcdef\n", fixes) == ("XYZ\n", 1)


DP_HEAD = (
    "import torch\nfrom torch import nn\n\nDEVICE = torch.device('cuda')\n\n\nclass Net(nn.Module):\n"
    "\tdef __init__(self):\n\t\tsuper().__init__()\n\t\tself.fc = nn.Linear(4, 2)\n\n\tdef forward(self, x):\n"
)
DP_TAIL = "\n\nmodel = nn.DataParallel(Net().to(DEVICE))\n"
FSDP_HEAD = (
    "import torch\nimport torch.distributed as dist\nfrom torch.distributed.fsdp import fully_shard\n\n"
    "dist.init_process_group('gloo')\nmodel = torch.nn.Linear(4, 1)\nfully_shard(model)\n"
)
DDP_BATCHNORM_HEAD = (
    "import torch.distributed as dist\nimport torchvision\nfrom torch import nn\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n\ndist.init_process_group('nccl')\n"
)
ARGS_HEAD = "import argparse\nimport os\nimport torch.distributed as dist\n\nparser = argparse.ArgumentParser()\n"
SPREAD_OVER_LINES = [
    pytest.param(
        "DP001", DP_HEAD + "\t\t# on the GPU\n\t\tx = x.to(\n\t\t\tDEVICE,\n\t\t)\n\t\treturn self.fc(x)\n" + DP_TAIL,
        DP_HEAD + "\t\t# on the GPU\n\t\treturn self.fc(x)\n" + DP_TAIL, id="statement-dropped",
    ),
    pytest.param(
        "FSDP003", FSDP_HEAD + "print((model\n\t.module\n\t.weight))\n", FSDP_HEAD + "print((model\n\t.weight))\n", id="module-dropped",
    ),
    pytest.param(
        "DDP010", DDP_BATCHNORM_HEAD + "model = DDP(torchvision.models.resnet18()  # weights later\n\t.cuda(), device_ids=[0])\n",
        DDP_BATCHNORM_HEAD + "model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(torchvision.models.resnet18()  # weights later\n"
        "\t.cuda()), device_ids=[0])\n",
        id="sync-batchnorm",
    ),
    pytest.param(
        "DDP015", ARGS_HEAD + "parser.add_argument(\n\t'--local_rank',\n\ttype=int,\n\tdefault=-1,\n)\ndist.init_process_group('nccl')\n",
        ARGS_HEAD + "parser.add_argument(\n\t'--local_rank',\n\ttype=int,\n\tdefault=int(os.environ.get(\"LOCAL_RANK\", -1)),\n)\n"
        "dist.init_process_group('nccl')\n",
        id="environment-default",
    ),
]


@pytest.mark.parametrize(("code", "text", "expected"), SPREAD_OVER_LINES)
def test_fix_of_code_spread_over_tab_indented_lines_of_a_crlf_file(code, text, expected):
    assert fixed(text.replace("\n", "\r\n"), code) == expected.replace("\n", "\r\n")


def test_a_dropped_statement_is_the_edit_of_its_own_lines():
    text = DP_HEAD + "\t\t# on the GPU\n\t\tx = x.to(DEVICE)\n\t\treturn self.fc(x)\n" + DP_TAIL
    a = analyze(text, "t.py")
    dropped = a.tree.body[-2].body[-1].body[0]
    assert statement_edit(a, dropped, lambda stmt: []) == Edit(14, 0, 15, 0, "")


def test_a_dropped_statement_on_an_if_line_leaves_the_others_in_its_body():
    text = DP_HEAD + "\t\tif x.ndim: x = x.to(DEVICE); y = 1\n\t\treturn self.fc(x)\n" + DP_TAIL
    assert fixed(text, "DP001") == text.replace("if x.ndim: x = x.to(DEVICE); y = 1\n", "if x.ndim:\n\t\t\ty = 1\n")


@pytest.mark.parametrize("code, text, expected", [
    ("DDP900", "if True:\r\n\t# ddpify: ignore[DDP001]\r\n\tx = max(\r\n\t\t1,  # noqa: DDP006, E501\r\n\t)\t# ddpify: ignore\r\n",
     "if True:\r\n\r\n\tx = max(\r\n\t\t1,  # noqa: E501\r\n\t)\r\n"),
    ("DDP900", "s = '''\n# ddpify: ignore[DDP001]\n'''  # ddpify: ignore[DDP001]\n", "s = '''\n# ddpify: ignore[DDP001]\n'''\n"),
])
def test_comment_fix_edits_the_comment_node_only(code, text, expected):
    """DDP900's fix rewrites LibCST's Comment node: a line of its own keeps no indentation, a comment
    inside brackets or after a tab loses its spaces, a multi-line string that reads like one stays."""
    assert fixed(HEAD + text, code) == HEAD + expected


@pytest.mark.parametrize(("body", "expected"), [
    ("if model.training:\n    pass\nelif True:\n    print('b')\n", "if model.training:\n    pass\nelif True:\n    if rank == 0:\n        print('b')\n"),
    ("try:\n    pass\nexcept ValueError:\n    print('e')\n", "try:\n    pass\nexcept ValueError:\n    if rank == 0:\n        print('e')\n"),
    ("match model.training:\n    case True:\n        pass\n    case _:\n        print('m')\n",
     "match model.training:\n    case True:\n        pass\n    case _:\n        if rank == 0:\n            print('m')\n"),
    ("def f():\n    match model.training:\n        case _:\n            print(model.training)\n",
     "def f():\n    match model.training:\n        case _:\n            if dist.get_rank() == 0:\n                print(model.training)\n"),
    ("for i in range(2): x = i; print(x)\n", "for i in range(2):\n    x = i\n    if rank == 0:\n        print(x)\n"),
])
def test_a_statement_in_a_clause_or_a_one_line_body_is_found_by_its_ast_position(body, expected):
    """The parse pairs its statements with the ast's block by block (elif, except, case, one-line bodies)."""
    assert fixed(HEAD + body, "DDP007") == HEAD + expected


def test_an_expression_fix_inside_a_match_case_lands_at_its_columns():
    body = "def save():\n    match model.training:\n        case _:\n            torch.save(model.state_dict(), 'm.pt')\n"
    out = fixed(HEAD + body, "DDP008")
    assert out == HEAD + body.replace("model.state_dict()", "model.module.state_dict()")
