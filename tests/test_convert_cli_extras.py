"""`ddpify convert` beyond plain scripts: notebooks, and files that change while being converted."""

import json
import shutil
from pathlib import Path

import nbformat
from click.testing import CliRunner

from ddpify.cli import cli

NOTEBOOK = Path(__file__).resolve().parent.parent / "fixtures" / "notebooks" / "mlp_train.ipynb"


def _copy(tmp_path):
    target = tmp_path / "nb.ipynb"
    shutil.copy(NOTEBOOK, target)
    return target


def test_dp_writes_a_valid_notebook_and_keeps_markdown(tmp_path):
    nb = _copy(tmp_path)
    result = CliRunner().invoke(cli, ["convert", str(nb), "--to", "dp"])
    assert result.exit_code == 0, result.output
    out = nbformat.read(tmp_path / "nb_dp.ipynb", as_version=4)
    nbformat.validate(out)
    before = json.loads(nb.read_text())
    assert [c["source"] for c in out.cells if c.cell_type == "markdown"] == [
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in before["cells"] if c["cell_type"] == "markdown"
    ]
    assert any("DataParallel" in c.source for c in out.cells if c.cell_type == "code")
    assert "cell " in result.output


def test_ddp_writes_a_script_and_refuses_in_place(tmp_path):
    nb = _copy(tmp_path)
    result = CliRunner().invoke(cli, ["convert", str(nb), "--to", "ddp"])
    assert result.exit_code == 0, result.output
    script = (tmp_path / "nb_ddp.py").read_text()
    compile(script, "nb_ddp.py", "exec")
    assert "DDP(" in script
    refused = CliRunner().invoke(cli, ["convert", str(nb), "--to", "ddp", "--in-place"])
    assert refused.exit_code == 2


def test_check_reports_work_without_writing(tmp_path):
    nb = _copy(tmp_path)
    result = CliRunner().invoke(cli, ["convert", str(nb), "--to", "dp", "--check"])
    assert result.exit_code == 1
    assert not (tmp_path / "nb_dp.ipynb").exists()


def test_in_place_refuses_a_file_changed_while_it_was_converted(tmp_path, monkeypatch):
    import ddpify.convert as convert_module

    script = tmp_path / "train.py"
    shutil.copy(NOTEBOOK.parent.parent / "basic_main.py", script)
    real = convert_module.convert_source

    def convert_then_edit(*args, **kwargs):
        result = real(*args, **kwargs)
        script.write_text(script.read_text() + "# edited meanwhile\n")
        return result

    monkeypatch.setattr(convert_module, "convert_source", convert_then_edit)
    outcome = CliRunner().invoke(cli, ["convert", str(script), "--to", "ddp", "--in-place"])
    assert outcome.exit_code == 2
    assert "changed on disk" in outcome.output
    assert script.read_text().endswith("# edited meanwhile\n")
