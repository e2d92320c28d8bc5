"""A conversion adds no collective, barrier or host sync to a per-batch loop (issue 26).

A per-batch loop is one the analysis finds iterating a DataLoader (its step loops, training or
evaluation). In each, the calls that make every rank wait are counted by the branch of the loop
body they sit in (the `if` tests around them, rank tests left out, since the conversion puts output
under `if RANK == 0`): collectives (torch.distributed's, or a function of the script that calls
one, like the conversion's `mean_over_ranks`), host syncs (`.item()`, `.cpu()`, `.tolist()`,
`.numpy()`) and prints. Against the original, the converted loop may not have more host syncs or
prints in any branch, and may add a collective only where a training loop already prints: the
printed loss averaged over the ranks, one all_reduce per print the original makes at that step. An
evaluation loop gets none: its metrics are reduced once, after it.

The pairs are the snapshots (fixtures/expected/: every fixture's ddp and dp output and the
projects') and fixtures/real/ converted with --to ddp, fixtures/fsdp/ with --to fsdp. Nothing runs.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

import pytest

from ddpify.anatomy import analyze
from ddpify.anatomy.distributed.names import COLLECTIVES
from ddpify.anatomy.distributed.ranks import mentions_rank

try:
    from helpers import converted_file
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import converted_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXPECTED = FIXTURES / "expected"
HOST_SYNCS = frozenset({"item", "cpu", "tolist", "numpy"})
COLLECTIVE, HOST_SYNC, PRINT = "collective", "host sync", "print"
Key = tuple[tuple[str, ...], str]  # (the branch: its `if` tests, `not (...)` in an else), kind
# Conversions that add waits today: {name: why} (strict xfail, so fixing one fails until it is removed).
KNOWN_WAITS: dict[str, str] = {}


def snapshot_pairs() -> list[tuple[str, Path, Path]]:
    """(name, original, its snapshot) for every file of fixtures/expected/."""
    pairs = []
    for target in ("ddp", "dp"):
        pairs += [(f"{target}/{p.name}", FIXTURES / p.name, p) for p in sorted((EXPECTED / target).glob("*.py"))]
    for converted in sorted((EXPECTED / "projects").rglob("*.py")):
        relative = converted.relative_to(EXPECTED)
        pairs.append((relative.as_posix(), FIXTURES / relative, converted))
    return pairs


def converted_fixtures() -> list:
    """(name, fixture, target) of the fixtures without a snapshot, a known adder of waits marked."""
    found = ([(f"real/{p.name}", p, "ddp") for p in sorted((FIXTURES / "real").glob("*.py"))]
             + [(f"fsdp/{p.name}", p, "fsdp") for p in sorted((FIXTURES / "fsdp").glob("*.py"))])
    return [pytest.param(*entry, id=entry[0], marks=known_waits(entry[0])) for entry in found]


def known_waits(name: str) -> list:
    return [pytest.mark.xfail(strict=True, reason=KNOWN_WAITS[name])] if name in KNOWN_WAITS else []


def sync_counts(text: str, path: str) -> list[Counter[Key]]:
    """The waits of each per-batch loop of a script, in source order, by branch and kind."""
    a = analyze(text, path)
    loops = sorted((loop.node for loop in a.step_loops), key=lambda node: (node.lineno, node.col_offset))
    return [Counter((branch(a, call, loop), kind) for call, kind in waits(a, loop)) for loop in loops]


def waits(a, loop: ast.For):
    """(call, kind) for every call in the loop's body that makes a rank wait."""
    for node in ast.walk(ast.Module(body=loop.body, type_ignores=[])):
        if isinstance(node, ast.Call):
            kind = wait_kind(a, node)
            if kind is not None:
                yield node, kind


def wait_kind(a, call: ast.Call) -> str | None:
    qualname = a.qualname(call.func)
    callee = a.callee(call)
    if qualname in COLLECTIVES or (callee and a.function_contains(callee, lambda n: is_collective(a, n))):
        return COLLECTIVE
    if isinstance(call.func, ast.Attribute) and call.func.attr in HOST_SYNCS and not call.args:
        return HOST_SYNC
    return PRINT if qualname == "print" else None


def is_collective(a, node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and a.qualname(node.func) in COLLECTIVES


def branch(a, node: ast.AST, loop: ast.For) -> tuple[str, ...]:
    """The `if` tests between the loop and `node` (`not (test)` in an else), rank tests left out."""
    tests = []
    child = node
    for parent in a.enclosing(node, ast.AST):
        if parent is loop:
            break
        if isinstance(parent, ast.If) and child is not parent.test and not mentions_rank(a, parent.test):
            test = ast.unparse(parent.test)
            tests.append(test if child in parent.body else f"not ({test})")
        child = parent
    return tuple(reversed(tests))


def added_waits(original: list[Counter[Key]], converted: list[Counter[Key]], trains: list[bool]) -> list[str]:
    """What the converted loops wait on beyond what the original's do, one line each."""
    found = []
    for index, (before, after, training) in enumerate(zip(original, converted, trains)):
        for (where, kind), count in after.items():
            allowed = before[where, kind] + (before[where, PRINT] if kind == COLLECTIVE and training else 0)
            if count > allowed:
                found.append(f"loop {index + 1}, branch {where or '(every batch)'}: {count} {kind} calls, the original "
                             f"allows {allowed}")
    return found


def check(name: str, original_text: str, converted_text: str) -> None:
    original = sync_counts(original_text, name)
    converted = sync_counts(converted_text, name)
    assert len(original) == len(converted), f"{name}: {len(original)} per-batch loops became {len(converted)}"
    trains = [loop.trains for loop in sorted(analyze(original_text, name).step_loops, key=lambda l: l.line)]
    added = added_waits(original, converted, trains)
    assert not added, f"{name}: the conversion makes ranks wait in a per-batch loop:\n" + "\n".join(added)


@pytest.mark.parametrize("name, original, converted", snapshot_pairs(), ids=[p[0] for p in snapshot_pairs()])
def test_snapshot_adds_no_wait_to_a_per_batch_loop(name: str, original: Path, converted: Path) -> None:
    check(name, original.read_text(), converted.read_text())


@pytest.mark.parametrize("name, fixture, target", converted_fixtures())
def test_conversion_adds_no_wait_to_a_per_batch_loop(name: str, fixture: Path, target: str) -> None:
    result = converted_file(fixture, target)
    if result.missing:
        pytest.skip(f"incomplete conversion: {result.missing[0].what}")
    check(name, fixture.read_text(), result.output)


ORIGINAL_LOOPS = """
import torch
from torch.utils.data import DataLoader

def main(model, optimizer, train_set, val_set):
    loader = DataLoader(train_set, batch_size=8, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=8)
    for step, (x, y) in enumerate(loader):
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(loss.item())
    correct = 0
    with torch.no_grad():
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum().item()
    print(correct)
"""


@pytest.mark.parametrize("edit, added", [
    ("        optimizer.step()\n", "        optimizer.step()\n        dist.barrier()\n"),
    ("            print(loss.item())\n", "            print(loss.item())\n        total = reduced(loss)\n"),
    ("            correct += ", "            dist.all_reduce(x)\n            correct += "),
    ("        loss.backward()\n", "        loss.backward()\n        scale = loss.detach().cpu()\n"),
], ids=["barrier per step", "reduction outside the printing branch", "reduction per evaluation batch", "host copy"])
def test_a_wait_the_conversion_adds_is_found(edit: str, added: str) -> None:
    converted = "import torch.distributed as dist\n" + ORIGINAL_LOOPS.replace(edit, added) + (
        "\ndef reduced(value):\n    dist.all_reduce(value)\n    return value\n")
    with pytest.raises(AssertionError, match="makes ranks wait in a per-batch loop"):
        check("loops.py", ORIGINAL_LOOPS, converted)


def test_a_reduction_for_the_print_the_original_makes_passes() -> None:
    printed = "            print(loss.item())\n"
    converted = "import torch.distributed as dist\n" + ORIGINAL_LOOPS.replace(
        printed, "            dist.all_reduce(loss)\n" + printed)
    check("loops.py", ORIGINAL_LOOPS, converted)
