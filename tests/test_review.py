"""The Markdown review summary of a conversion."""

from pathlib import Path

from ddpify.codemods.pipeline import ConversionResult
from ddpify.codemods.report import Advice, Change, Missing
from ddpify.convert import convert_source
from ddpify.review import markdown_summary

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_summary_of_a_real_conversion():
    path = FIXTURES / "helper_functions.py"
    result = convert_source(path.read_text(), "ddp", path=str(path))
    md = markdown_summary("helper_functions.py", result, "ddp")
    assert md.startswith("## ddpify: `helper_functions.py` → ddp")
    assert "### Changes" in md and "**wrap**: the model must be wrapped to run on every GPU" in md
    assert "**rank0**" in md and "- line 30: print on rank 0 only" in md
    # changes are grouped: each transform heading appears once
    assert md.count("**sampler**") == 1 and md.count("**setup**") == 1
    assert "### Warnings (1)" in md and "line 52:" in md
    diff = md.split("```diff\n", 1)[1].split("\n```", 1)[0]
    assert diff.startswith("--- a/helper_functions.py\n+++ b/helper_functions.py\n@@")
    assert "+" in diff and md.rstrip().endswith("```")


def test_groups_keep_first_appearance_order_and_original_lines():
    result = ConversionResult(
        source="a\nb\n", output="a\nB\n",
        changes=[Change(9, "rank0", "print on rank 0 only"), Change(2, "wrap", "wrapped"), Change(5, "rank0", "x")],
        advice=[Advice(7, "look here")],
    )
    md = markdown_summary("t.py", result)
    assert md.index("**wrap**") < md.index("**rank0**")
    assert md.index("- line 5: x") < md.index("- line 9: print")
    assert "- ⚠️ line 7: look here" in md
    assert "-b\n+B" in md


def test_nothing_to_do():
    result = convert_source("import torch\ntorch.distributed.init_process_group('nccl')\n", "ddp")
    md = markdown_summary("x.py", result)
    assert "**Status: nothing to do**: already distributed" in md and "```diff" not in md
    plain = ConversionResult(source="x = 1\n", output="x = 1\n")
    assert "**Status: nothing to do**: no changes needed" in markdown_summary("y.py", plain)


def test_status_converted_and_incomplete_with_what_is_missing():
    result = ConversionResult(source="a\n", output="b\n", changes=[Change(1, "wrap", "wrapped")])
    assert "**Status: converted**\n" in markdown_summary("t.py", result)
    result.missing = [Missing(4, "training loader not sharded", "add a DistributedSampler by hand")]
    md = markdown_summary("t.py", result)
    assert "**Status: incomplete**: training loader not sharded (line 4)" in md
    assert "### Missing (1)" in md and "- ❌ line 4: training loader not sharded; add a DistributedSampler by hand" in md


def test_diff_containing_backticks_gets_a_longer_fence():
    result = ConversionResult(source='s = "```"\n', output='s = "````"\n', changes=[Change(1, "wrap", "m")])
    md = markdown_summary("z.py", result)
    assert "````diff" in md or "`````diff" in md


def test_notebook_locations_and_extra_warnings():
    from ddpify.convert import convert_notebook
    from ddpify.notebooks import lint_location

    nb_path = FIXTURES / "notebooks" / "mlp_train.ipynb"
    _, result, cell_map = convert_notebook(nb_path, "dp")
    md = markdown_summary("mlp_train.ipynb", result, "dp", locate=lambda line: lint_location(cell_map, line),
                          warnings=cell_map.warnings)
    assert "- cell 7:line 2: wrapped model in nn.DataParallel" in md
    assert "- cell 9:line 1: model.layer1 -> model.module.layer1" in md
    assert "- ⚠️ cell 2:line 1: IPython line skipped (not Python): !pip install -q torch" in md
