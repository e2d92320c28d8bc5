"""The anatomy that shows pending DDP wraps made (ddpify.anatomy.distributed.wraps_made) answers what
`.module` access and rank 0 ask of the model's reads as the analysis of the wrap's output does, and
declines where it could not: a statement on the anchor's line, a model that only the wrap makes one."""

from __future__ import annotations

import ast
import textwrap

import pytest

from ddpify.anatomy import analyze
from ddpify.anatomy.distributed.wrappers import is_wrapper, wrapper_or_plain
from ddpify.anatomy.distributed.wraps_made import with_wraps_made
from ddpify.anatomy.values import ROLE_MODEL
from ddpify.codemods.ddp.wrap import WrapModel
from ddpify.codemods.options import Options
from ddpify.codemods.pipeline import run_pipeline

HEAD = """\
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.classes = 2

    def forward(self, x):
        return self.fc(x)


"""

TRAIN = """\
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
"""

SHAPES = {
    "module level": """\
model = Net()
print(model.classes)
model.to("cpu")
{train}print(model.classes, model.state_dict())
""",
    "in main, handed to a function": """\
def report(net):
    print(net.classes)


def main():
    model = Net()
    report(model)
    model.to("cpu")
{train_in_block}    report(model)


main()
""",
    "inside an if branch": """\
train = True
if train:
    model = Net()
    model.to("cpu")
{train_in_block}    print(model.classes)
else:
    print("nothing to train")
""",
    "compiled where bound": """\
model = Net()
model = torch.compile(model)
{train}print(model.classes)
""",
    "reloaded after training": """\
def evaluate(net):
    return net.classes


model = Net()
{train}print(evaluate(model))
model = torch.load("best.pt")
print(evaluate(model))
""",
    "built in a function": """\
def build():
    net = Net()
    net.to("cpu")
    return net


model = build()
{train}print(model.classes)
""",
    "an attribute of self": """\
class Trainer:
    def __init__(self):
        self.model = Net()
        self.model.to("cpu")
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def fit(self):
        for _ in range(2):
            self.opt.zero_grad()
            self.model(torch.randn(8, 4)).sum().backward()
            self.opt.step()
        print(self.model.classes)


Trainer().fit()
""",
}


def _script(shape: str) -> str:
    return HEAD + SHAPES[shape].format(train=TRAIN, train_in_block=textwrap.indent(TRAIN, "    "))


def _pending_wraps(text: str):
    """The anatomy of `text`, the wraps WrapModel plans on it, and the imports they need."""
    anatomy = analyze(text, "train.py")
    wrap = WrapModel(None, anatomy, Options())
    wrap.plan()
    return anatomy, wrap.edits, {i.local_name: i.qualified for i in wrap.report.imports}


def _judgements(anatomy, inserted: set[str]) -> list[tuple[str, str, bool, bool]]:
    """For each read of a model outside the statements the wrap inserted, in order: its statement,
    itself, and whether it holds the wrapper (and whether a plain model too)."""
    found = []
    for node in sorted(anatomy.nodes_of(ast.Name, ast.Attribute), key=lambda n: (n.lineno, n.col_offset)):
        stmt = anatomy.stmt_of.get(node)
        if stmt is None or isinstance(node.ctx, ast.Store) or not anatomy.has_role(node, ROLE_MODEL):
            continue
        top = stmt
        while top in anatomy.parents and isinstance(anatomy.parents[top], ast.stmt):
            top = anatomy.parents[top]
        if ast.unparse(top) in inserted or ast.unparse(stmt) in inserted:
            continue
        holds = is_wrapper(anatomy, node), wrapper_or_plain(anatomy, node)
        found.append((ast.unparse(stmt).splitlines()[0], ast.unparse(node), *holds))
    return found


@pytest.mark.parametrize("shape", SHAPES)
def test_the_reads_of_a_model_hold_the_wrapper_where_they_do_in_the_wraps_output(shape):
    text = _script(shape)
    anatomy, edits, imports = _pending_wraps(text)
    assert edits.wraps and not edits.wraps_unlisted
    made = with_wraps_made(anatomy, edits.wraps, imports)
    assert made is not None and made.wraps_made
    output = run_pipeline(text, "train.py", [WrapModel], Options()).output
    inserted = {ast.unparse(stmt) for wrap in edits.wraps for stmt in ast.parse(wrap.code).body}
    seen = _judgements(made, inserted)
    assert seen == _judgements(analyze(output, "train.py"), inserted)
    assert any(holds for _, _, holds, _ in seen)  # the wrap is seen: some read holds the wrapper
    assert not any(holds for _, _, holds, _ in _judgements(anatomy, inserted))  # and not in the code as it is


def test_the_code_as_it_is_keeps_its_answers():
    """The anatomy the plans ahead see is a copy: the stage's own anatomy does not see the wrap."""
    text = _script("module level")
    anatomy, edits, imports = _pending_wraps(text)
    nodes, calls = len(anatomy.nodes), len(anatomy.calls)
    with_wraps_made(anatomy, edits.wraps, imports)
    assert (len(anatomy.nodes), len(anatomy.calls)) == (nodes, calls)
    assert not anatomy.wraps_made and not anatomy.stands_beside


def test_no_anatomy_where_a_statement_shares_the_anchors_line():
    """`model.to(dev); print(model.classes)`: the print reads the wrapper once the wrap is made, lines can't tell."""
    text = _script("module level").replace('model.to("cpu")\n', 'model.to("cpu"); print(model.classes)\n')
    anatomy, edits, imports = _pending_wraps(text)
    assert edits.wraps
    assert with_wraps_made(anatomy, edits.wraps, imports) is None


def test_no_anatomy_where_the_wrap_makes_a_variable_a_model():
    """A model of a class another file defines: the analysis knows it for a model only once wrapped."""
    text = textwrap.dedent("""\
        import torch
        from nets import Net


        def train(net):
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for _ in range(2):
                opt.zero_grad()
                net(torch.randn(8, 4)).sum().backward()
                opt.step()
            print(net.classes)


        model = Net()
        model.to("cpu")
        train(model)
        """)
    anatomy, edits, imports = _pending_wraps(text)
    assert edits.wraps
    assert with_wraps_made(anatomy, edits.wraps, imports) is None
