"""Jupyter notebooks: join their code cells into one script, and put a (converted) script back into cells.

Converting one is `ddpify.convert.convert_notebook`: this module knows cells, not conversions.

The joined script starts each code cell with a marker line, `# %% [cell N]` (N: the cell's 0-based
index in `nb.cells`), so a converted script can be split back into the cells it came from. IPython
lines (`!pip ...`, `%matplotlib inline`, `x = !ls`, `%%bash` cells) are not Python: they become
comments in the script (`pass  # ...` when indented, so blocks stay valid), each reported as a
warning, and are restored verbatim when the cells are written back.

Code inserted by a conversion between two cells (after the last statement of one, before the
first of the next) lands at the end of the earlier cell: run top to bottom, the notebook executes
the same statements in the same order as the converted script.
"""

from __future__ import annotations

import copy
import os
import re
import warnings

import nbformat
from nbformat.warnings import MissingIDFieldWarning

MARKER = "# %% [cell {index}]"
_MARKER_RE = re.compile(r"^# %% \[cell (\d+)\]$")
_MAGIC_RE = re.compile(r"^(\s*)(?:pass  )?# ddpify: IPython line (\d+) skipped: ")
# Line magics, shell escapes, and `x = !cmd` / `x = %magic` assignments.
_IPYTHON_LINE = re.compile(r"^\s*(?:[!%]|[\w.]+\s*=\s*[!%]\s*\w)")
# Cell magics whose body is Python (kept and converted); any other cell magic comments the whole cell.
_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}


class CellMap(dict):
    """Script line (1-based) -> (cell index in `nb.cells`, 1-based line in that cell).

    Marker lines are not in the map. `warnings` lists the IPython lines that were skipped and
    `magics` holds their original text, by id, for `split_script`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.warnings: list[str] = []
        self.magics: dict[int, str] = {}
        self.cells: list[int] = []  # indices of the code cells joined, in order


def read_notebook(path: str | os.PathLike):
    """The notebook at `path`, upgraded to nbformat 4 (which every function here expects).

    Cells without ids (written before nbformat 4.5) get ids the way Jupyter gives them, without
    nbformat's multi-line warning about it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingIDFieldWarning)
        return nbformat.read(os.fspath(path), as_version=4)


def read_notebook_script(path: str | os.PathLike) -> tuple[str, "CellMap"]:
    """`notebook_to_script` of the notebook at `path`; a file that is no readable notebook (not JSON,
    not a notebook, an unknown version) raises a one-line SourceError naming it."""
    from ddpify.sources import SourceError

    try:
        return notebook_to_script(path)
    except OSError as e:
        raise SourceError(path, f"cannot be read: {e.strerror or e}") from None
    except Exception as e:  # nbformat: not JSON, not a notebook, unknown version...
        raise SourceError(path, f"is not a readable notebook: {type(e).__name__}: {e}") from None


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def notebook_to_script(nb) -> tuple[str, CellMap]:
    """The code cells of `nb` (a NotebookNode or a path) joined in order, and the line map."""
    if isinstance(nb, (str, os.PathLike)):
        nb = read_notebook(nb)
    cell_map = CellMap()
    out: list[str] = []

    def skip(line: str, index: int, number: int) -> str:
        magic_id = len(cell_map.magics)
        cell_map.magics[magic_id] = line
        cell_map.warnings.append(
            f"{lint_location(cell_map, None, cell=index, line=number)}: IPython line skipped (not Python): {line.strip()}"
        )
        indent = line[: len(line) - len(line.lstrip())]
        return f"{indent}{'pass  ' if indent else ''}# ddpify: IPython line {magic_id} skipped: {line.strip()}"

    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        cell_map.cells.append(index)
        out.append(MARKER.format(index=index))
        lines = _source(cell).split("\n")
        whole_cell = False
        first = lines[0].strip() if lines else ""
        if first.startswith("%%"):
            name = first[2:].split()[0] if first[2:].split() else ""
            whole_cell = name not in _PYTHON_CELL_MAGICS
        for number, line in enumerate(lines, start=1):
            if whole_cell or (number == 1 and first.startswith("%%")) or _IPYTHON_LINE.match(line):
                line = skip(line, index, number) if line.strip() or not whole_cell else line
            out.append(line)
            cell_map[len(out)] = (index, number)
    text = "\n".join(out) + "\n"
    return text, cell_map


def split_script(text: str, cell_map: CellMap) -> dict[int, str]:
    """Cut a (converted) joined script back into cell sources, restoring skipped IPython lines."""
    cells: dict[int, list[str]] = {}
    current: list[str] | None = None
    preamble: list[str] = []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        marker = _MARKER_RE.match(line)
        if marker:
            current = cells.setdefault(int(marker.group(1)), [])
            continue
        magic = _MAGIC_RE.match(line)
        if magic:
            line = cell_map.magics[int(magic.group(2))]
        (preamble if current is None else current).append(line)
    if sorted(cells) != sorted(cell_map.cells):
        raise ValueError("the converted script lost some cell markers; cannot split it back into cells")
    if preamble and cell_map.cells:  # code a conversion put above the first marker goes to the first cell
        cells[cell_map.cells[0]][:0] = preamble
    return {index: "\n".join(body) for index, body in cells.items()}


def rebuild_notebook(nb, text: str, cell_map: CellMap):
    """A copy of `nb` whose code cells hold the cells of `text` (a converted joined script).

    Markdown, outputs and metadata are untouched; a code cell whose code did not change is the
    same object data as before, so it serializes to the same JSON.
    """
    new = copy.deepcopy(nb)
    for index, source in split_script(text, cell_map).items():
        if source != _source(nb.cells[index]):
            new.cells[index].source = source
    return new


def lint_location(cell_map: CellMap | None, script_line: int | None, *, cell: int | None = None, line: int | None = None) -> str:
    """`cell 4:line 2` for a joined-script line: the 1-based position in the notebook and in the cell.

    Cells are counted as a reader counts them scrolling down, markdown included (cell 1 is the first).
    A line that is not in the map (a marker, or code a conversion added) is named by the nearest
    mapped line above it.
    """
    if cell is None:
        found = None
        for candidate in range(script_line or 0, 0, -1):
            if candidate in cell_map:
                found = cell_map[candidate]
                break
        if found is None:
            return f"line {script_line}"
        cell, line = found
    return f"cell {cell + 1}:line {line}"


def write_notebook(nb, path) -> None:
    nbformat.validate(nb)
    nbformat.write(nb, os.fspath(path))
