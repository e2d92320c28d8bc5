"""A project is written all or nothing (ddpify.project_conversion.ProjectWrites): where writing one of
its files fails, no file of it is written, in place or into the mirror, and no temp file or
directory made for it is left. The failures are forced: a write refused, a file changed on disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import ddpify.commands.convert
import ddpify.project_conversion
from ddpify.cli import cli
from ddpify.project_conversion import convert_entry, write_mirror
from ddpify.sources import SourceError, write_beside

PROJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "projects"


def copy_classic(tmp_path: Path) -> Path:
    """fixtures/projects/classic: train.py, and the modules it imports, two of which change (data.py, utils.py)."""
    return Path(shutil.copytree(PROJECTS / "classic", tmp_path / "classic", ignore=shutil.ignore_patterns("__pycache__")))


def every_file(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def refusing(name: str):
    """write_beside, refusing to write any file called `name`."""
    def write(path, data, mode=None):
        if Path(path).name == name:
            raise SourceError(path, "cannot write: No space left on device (forced)")
        return write_beside(path, data, mode)
    return write


@pytest.mark.parametrize("mode, refused", [
    (["--in-place"], "utils.py"),  # the last file written: train.py and data.py were staged before it
    ([], "model.py"),  # an unchanged module copied into the mirror, after every converted file
])
def test_a_write_that_fails_leaves_every_file_of_the_project_as_it_was(tmp_path, monkeypatch, mode, refused):
    monkeypatch.setattr(ddpify.project_conversion, "write_beside", refusing(refused))
    project = copy_classic(tmp_path)
    before = every_file(tmp_path)
    result = CliRunner().invoke(cli, ["convert", str(project / "train.py"), "--to", "ddp", *mode])
    assert result.exit_code == 2, result.output
    assert every_file(tmp_path) == before  # no file written, no temp file, no mirror directory
    assert f"error: {tmp_path / 'classic_ddp' if not mode else project}/{refused}: cannot write: No space left on device (forced)" in \
        result.output.splitlines(), result.output
    held = sorted(line.split(": held: ")[0] for line in result.output.splitlines() if ": held: " in line)
    assert held and all(f"{refused}, of the same project, failed; nothing written" in line
                        for line in result.output.splitlines() if ": held: " in line)
    assert "wrote " not in result.output


def test_a_file_changed_on_disk_while_converting_holds_its_whole_project(tmp_path, monkeypatch):
    project = copy_classic(tmp_path)
    before = every_file(tmp_path)
    monkeypatch.setattr(ddpify.commands.convert, "unchanged_since_read", lambda source: Path(source.path).name != "data.py")
    result = CliRunner().invoke(cli, ["convert", str(project / "train.py"), "--to", "ddp", "--in-place"])
    assert result.exit_code == 2, result.output
    assert every_file(tmp_path) == before
    held = sorted(Path(line.split(": held: ")[0]).name for line in result.output.splitlines() if ": held: " in line)
    assert held == ["train.py", "utils.py"], result.output


def test_the_project_is_written_whole_when_every_write_succeeds(tmp_path):
    project = copy_classic(tmp_path)
    result = CliRunner().invoke(cli, ["convert", str(project / "train.py"), "--to", "ddp", "--in-place"])
    assert result.exit_code == 0, result.output
    changed = {name for name, data in every_file(project).items() if data != (PROJECTS / "classic" / name).read_bytes()}
    assert changed == {"train.py", "data.py", "utils.py"}
    assert sorted(line for line in result.output.splitlines() if line.startswith("wrote ")) == \
        sorted(f"wrote {project / name}" for name in changed)
    assert not list(project.rglob("*.ddpify-tmp"))


def test_verifys_mirror_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    project = copy_classic(tmp_path)
    conversion = convert_entry(project / "train.py", "ddp", {"batch_size": "per-gpu"})
    monkeypatch.setattr(ddpify.project_conversion, "write_beside", refusing("model.py"))
    with pytest.raises(SourceError, match="No space left on device"):
        write_mirror(conversion, tmp_path / "nested" / "mirror")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["classic"]  # the directories made for it are gone too
