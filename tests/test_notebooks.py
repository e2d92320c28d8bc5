"""Notebooks: code cells joined into a script, converted, and split back cell by cell."""

import ast
import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from ddpify.convert import convert_notebook
from ddpify.notebooks import (
    lint_location,
    notebook_to_script,
    read_notebook,
    split_script,
    write_notebook,
)

NOTEBOOKS = Path(__file__).resolve().parent.parent / "fixtures" / "notebooks"
MLP = NOTEBOOKS / "mlp_train.ipynb"
MAGICS = NOTEBOOKS / "magics.ipynb"


def _cell_json(nb):
    return [json.dumps(cell, sort_keys=True) for cell in json.loads(nbformat.writes(nb))["cells"]]


def test_script_joins_code_cells_in_order_with_a_line_map():
    text, cell_map = notebook_to_script(MLP)
    ast.parse(text)
    lines = text.splitlines()
    nb = read_notebook(MLP)
    for script_line, (cell, line) in cell_map.items():
        assert lines[script_line - 1] == nb.cells[cell].source.split("\n")[line - 1] or "ddpify: IPython line" in lines[script_line - 1]
    assert "# %% [cell 4]" not in text  # markdown cells are not in the script
    assert cell_map.cells == [1, 2, 3, 5, 6, 7, 8]


def test_magics_are_skipped_with_a_warning():
    text, cell_map = notebook_to_script(MAGICS)
    ast.parse(text)  # %%bash cell, `x = !ls`, indented `!nvidia-smi`, `%time`
    assert "!nvidia-smi" not in [line.strip() for line in text.splitlines()]
    assert "    pass  # ddpify: IPython line" in text
    warnings = "\n".join(cell_map.warnings)
    for magic in ("%%bash", "echo hello", "files = !ls", "!nvidia-smi", "%time torch.save"):
        assert magic in warnings
    assert "cell 2:line 7" in warnings


def test_split_script_round_trips_every_cell():
    nb = read_notebook(MAGICS)
    text, cell_map = notebook_to_script(nb)
    assert split_script(text, cell_map) == {i: nb.cells[i].source for i in cell_map.cells}


def test_dp_notebook_rewrites_only_the_cells_that_change(tmp_path):
    before = read_notebook(MLP)
    after = convert_notebook(MLP, "dp")[0]
    nbformat.validate(after)
    old, new = _cell_json(before), _cell_json(after)
    changed = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    assert changed == [6, 8]  # the model cell (wrap) and the cell reading model.layer1 (.module)
    assert "model = nn.DataParallel(model)" in after.cells[6].source
    assert "model.module.layer1" in after.cells[8].source
    assert after.cells[8].outputs == before.cells[8].outputs and after.metadata == before.metadata
    assert after.cells[7].source.startswith("%%time\n")  # the magic is restored
    out = tmp_path / "out.ipynb"
    write_notebook(after, out)
    nbformat.validate(nbformat.read(str(out), as_version=4))


def test_insertions_at_a_cell_boundary_go_to_the_earlier_cell():
    after = convert_notebook(MAGICS, "dp")[0]
    # the wrap follows the `if` block that ends cell 1, so it stays at the end of cell 1
    assert after.cells[1].source.endswith("    model = model.cuda()\nmodel = nn.DataParallel(model)")
    assert "    !nvidia-smi" in after.cells[1].source and "files = !ls" in after.cells[1].source
    assert after.cells[0].source == "%%bash\necho hello\nls"
    assert after.cells[2].source.endswith('%time torch.save(model.state_dict(), "w.pt")')


def test_unchanged_notebook_is_byte_identical(tmp_path):
    nb = new_notebook()
    nb.cells = [new_markdown_cell("hi"), new_code_cell("import torch\nx = torch.ones(2)\nprint(x)")]
    path = tmp_path / "plain.ipynb"
    nbformat.write(nb, str(path))
    out = tmp_path / "out.ipynb"
    write_notebook(convert_notebook(path, "dp")[0], out)
    assert out.read_bytes() == path.read_bytes()


def test_ddp_script_is_valid_python_with_the_magics_commented():
    script = convert_notebook(MLP, "ddp")[1].output
    compile(script, "mlp_train.py", "exec")
    assert "DistributedDataParallel" in script and "DistributedSampler" in script
    assert "# ddpify: IPython line 0 skipped: !pip install -q torch" in script


def test_lint_location():
    _, cell_map = notebook_to_script(MLP)
    assert lint_location(cell_map, 1) == "line 1"  # the first marker line precedes every cell line
    assert lint_location(cell_map, 2) == "cell 2:line 1"
    assert lint_location(cell_map, 5) == "cell 3:line 1"
    assert lint_location(cell_map, 9) == "cell 3:line 5"
    assert lint_location(cell_map, 10) == "cell 3:line 5"  # the next marker: named by the line above
    assert lint_location(cell_map, 11) == "cell 4:line 1"


def test_lost_markers_are_an_error():
    _, cell_map = notebook_to_script(MLP)
    with pytest.raises(ValueError):
        split_script("x = 1\n", cell_map)
