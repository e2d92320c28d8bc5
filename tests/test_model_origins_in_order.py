"""A wrapper of a model chosen in an if/elif chain takes one model in the file's order, never a set's:
the set of the variable's origins iterated in memory-address order, so `model = DDP(model)` got a
different model (or none, and with it "may hold BatchNorm") from run to run, and the public corpus's
makemore converted or ended incomplete by chance."""

from __future__ import annotations

import ast

from ddpify.anatomy import analyze
from ddpify.anatomy.values import ROLE_MODEL

CHOSEN = '''
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 64)


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))


def build(kind):
    if kind == "small":
        model = Small()
    elif kind == "wide":
        model = Wide()
    else:
        model = Deep()
    model = DDP(model)
    return model
'''


def _wrapper_origins(text: str) -> list[set]:
    a = analyze(text, "chosen.py")
    wraps = [n for n in ast.walk(a.tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "DDP"]
    return [a.origins(w, ROLE_MODEL) for w in wraps]


def test_the_wrapper_holds_the_first_model_the_file_builds():
    (origins,) = _wrapper_origins(CHOSEN)
    assert [site.line for site in origins] == [CHOSEN.splitlines().index("        model = Small()") + 1]

