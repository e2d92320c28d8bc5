"""The edit pass (edits/engine.py `Edits`, `_EditApplier`) on statements it used to skip: bodies on
their compound statement's line are spread one statement a line, and an edit the pass still cannot
make is a missing item of the conversion, never silently dropped."""

from __future__ import annotations

import ast
import textwrap

import pytest

from ddpify.codemods.base import Transform
from ddpify.codemods.options import Options
from ddpify.codemods.pipeline import Status, run_pipeline
from ddpify.convert import convert_source
from ddpify.edits.engine import Edits
from ddpify.edits.statements import names_bound, parse_statements


class _NoteBeforeY(Transform):
    """Inserts `note()` before every statement that assigns `y`."""

    NAME = "note"

    def plan(self) -> None:
        for stmt in self.anatomy.nodes:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "y" for t in stmt.targets):
                self.insert_before(stmt, "note()\n")
                self.changed(stmt.lineno, "noted")


def _run(code: str):
    return run_pipeline(textwrap.dedent(code), "snippet.py", [_NoteBeforeY], Options())


def test_a_body_on_its_header_line_is_spread_to_take_the_edit():
    result = _run("""\
        for i in range(3): x = i; y = x  # loop
        if x: y = 2
        else: y = 3
    """)
    assert result.output == textwrap.dedent("""\
        for i in range(3):
            x = i
            note()
            y = x  # loop
        if x:
            note()
            y = 2
        else:
            note()
            y = 3
    """)
    assert result.status is Status.CONVERTED


def test_a_line_of_statements_is_spread_when_a_later_one_takes_an_edit():
    assert _run("x = 1; y = x  # both\n").output == "x = 1\nnote()\ny = x  # both\n"


def test_an_edit_the_pass_cannot_place_is_missing_not_dropped():
    class _NoteOutsideTheCode(_NoteBeforeY):
        def plan(self) -> None:
            stmt = ast.parse("\n" * 40 + "y = 0").body[0]  # line 41: no statement of the code is there
            self.insert_before(stmt, "note()\n")

    result = run_pipeline("x = 1\ny = x\n", "snippet.py", [_NoteOutsideTheCode], Options())
    assert result.output == "x = 1\ny = x\n"
    assert result.status is Status.INCOMPLETE
    assert [m.what for m in result.missing] == ["ddpify planned an edit of this statement that it could not make"]


def test_dataparallel_drops_an_input_move_from_a_one_line_body():
    code = textwrap.dedent("""\
        import torch
        import torch.nn as nn

        DEVICE = torch.device("cuda")


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)

            def forward(self, x):
                if x.dim() > 1: x = x.to(DEVICE); y = 1
                return self.fc(x)


        model = Net().to(DEVICE)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            loss = model(torch.randn(8, 4).to(DEVICE)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """)
    result = convert_source(code, "dp")
    assert "        if x.dim() > 1:\n            y = 1\n        return self.fc(x)\n" in result.output
    assert "x.to(DEVICE)" not in result.output
    assert result.status is Status.CONVERTED


class _Setup(Transform):
    """Inserts `setup()` after the first statement and leaves room for helpers between the two."""

    NAME = "setup"

    def plan(self) -> None:
        first = self.anatomy.tree.body[0]
        self.insert_after(first, "def setup(): pass\n")
        self.leave_room_for_helpers_after(first)
        self.insert_after(first, "setup()\n")


def _asking_for(*names: str) -> type[Transform]:
    class _AsksForHelpers(Transform):
        NAME = "asks-" + "-".join(names)
        SEES_EDITS_OF = ()

        def plan(self) -> None:
            for name in names if self.can_add_helpers() else ():
                self.add_helper(name, f"def {name}(): pass\n")

    return _AsksForHelpers


def test_helpers_asked_for_in_the_setup_stage_land_after_its_helpers_once_each_in_order():
    result = run_pipeline("import torch\nx = 1\n", "snippet.py", [_Setup, _asking_for("a", "b"), _asking_for("b", "c")], Options())
    assert result.output == ("import torch\ndef setup(): pass\ndef a(): pass\ndef b(): pass\ndef c(): pass\n"
                             "setup()\nx = 1\n")


def test_without_a_setup_planned_alongside_there_is_no_room_for_helpers():
    assert run_pipeline("x = 1\n", "snippet.py", [_asking_for("a")], Options()).output == "x = 1\n"


def test_helpers_asked_for_where_no_room_was_left_are_an_error_not_dropped():
    asked = Edits(helpers={"a": []})
    with pytest.raises(ValueError, match="no room"):
        Edits().merge(asked)


BINDING_STATEMENTS = '''\
import os, torch.distributed as dist, a.b.c
from m import x as y, z
RANK = int(os.environ.get("RANK", 0))
if torch.cuda.is_available():
    DEV, (P, *Q) = 1, (2, 3, 4)
elif other:
    E: int = 3
else:
    F += 1
for i, j in pairs:
    K = 1
while c:
    W = 1
with open(f) as fh, g() as (u, v):
    pass
try:
    T = 1
except E as err:
    pass
else:
    TE = 1
finally:
    TF = 1
def helper(q):
    inner = 1
class C:
    attr = 1
obj.attr = 1
seq[0] = 2
'''


def test_names_bound_are_those_an_inserted_statement_adds_to_its_scope():
    """What Edits.names_added reads of the statements an edit inserts: the names bound in their blocks,
    not those local to a def or class, nor an attribute or item assigned."""
    bound = {name for stmt in parse_statements(BINDING_STATEMENTS) for name in names_bound(stmt)}
    assert bound == {"os", "dist", "a", "y", "z", "RANK", "DEV", "P", "Q", "E", "F", "i", "j", "K", "W", "fh", "u", "v",
                     "T", "err", "TE", "TF", "helper", "C"}
