"""Converted lines stay within the file's own width (ddpify/codemods/width.py): what the conversion
widens is laid out again the way black would, and nothing else is touched."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from ddpify.codemods.width import fit, fit_to_width, width_limit

try:
    from helpers import converted_file
except ImportError:  # e.g. pytest --import-mode=importlib
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import converted_file

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures").glob("*.py"))


def fitted(code: str, limit: int = 40) -> str:
    """`code` (one statement, dedented) laid out for `limit` columns."""
    stmt = cst.parse_module("pass\n" + textwrap.dedent(code)).body[1]  # comments above a first statement are the module's
    return cst.Module(body=[fit(stmt, 0, limit)]).code


def test_the_limit_is_the_widest_original_line_and_at_least_pep8():
    assert width_limit("x = 1\n") == 79
    assert width_limit("x = 1\n" + "y = '" + "a" * 100 + "'\n") == 106


def test_a_call_that_ends_the_line_gets_one_argument_a_line_and_its_trailing_comment_stays():
    assert fitted("loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))  # note\n", 60) == (
        "loader = DataLoader(\n"
        "    ds,\n"
        "    batch_size=8,\n"
        "    sampler=DistributedSampler(ds),\n"
        ")  # note\n"
    )


def test_calls_open_inward_until_every_line_fits():
    out = fitted("model = DDP(model, device_ids=[LOCAL_RANK] if next(model.parameters()).is_cuda else None)\n", 50)
    assert out == (
        "model = DDP(\n"
        "    model,\n"
        "    device_ids=(\n"
        "        [LOCAL_RANK]\n"
        "        if next(model.parameters()).is_cuda\n"
        "        else None\n"
        "    ),\n"
        ")\n"
    )
    assert all(len(line) <= 50 for line in out.splitlines())


def test_a_bare_generator_argument_gets_no_trailing_comma():
    out = fitted("total = sum(value * weight for value, weight in zip(values, weights))\n", 62)
    assert out == "total = sum(\n    value * weight for value, weight in zip(values, weights)\n)\n"
    ast.parse(out)


def test_a_dict_literal_and_a_long_import_open_too():
    assert fitted('state = {"model": model.state_dict(), "optimizer": opt.state_dict()}\n', 50) == (
        'state = {\n    "model": model.state_dict(),\n    "optimizer": opt.state_dict(),\n}\n'
    )
    assert fitted("from torch.distributed.checkpoint import get_state_dict, set_state_dict\n", 60) == (
        "from torch.distributed.checkpoint import (\n    get_state_dict,\n    set_state_dict,\n)\n"
    )


def test_comments_are_reflowed_alone_and_a_trailing_one_moves_above_when_it_cannot_fit():
    out = fitted("""\
        # the user's note
        # ddpify: batch_size is per process; the global batch is batch_size * WORLD_SIZE.
        x = 1  # a trailing comment far too long to stay on this line
    """, 40)
    assert out == (
        "# the user's note\n"
        "# ddpify: batch_size is per process; the\n"
        "# global batch is batch_size *\n"
        "# WORLD_SIZE.\n"
        "# a trailing comment far too long to\n"
        "# stay on this line\n"
        "x = 1\n"
    )


def test_a_body_on_its_header_line_goes_below_it():
    out = fitted('if step % 10 == 0: print(f"step {step} loss {loss.item():.6f}")\n', 40)
    assert out == 'if step % 10 == 0:\n    print(\n        f"step {step} loss "\n        f"{loss.item():.6f}",\n    )\n'


def test_a_string_still_too_wide_splits_at_spaces_into_adjacent_literals():
    out = fitted('print(f"epoch {epoch} step {step:>{width}} loss {d[\'a b\']:.6f} {{not a field}} end")\n', 30)
    assert out == (
        "print(\n"
        '    f"epoch {epoch} step "\n'
        '    f"{step:>{width}} loss "\n'
        "    f\"{d['a b']:.6f} {{not a \"\n"
        '    f"field}} end",\n'
        ")\n"
    )
    assert fitted("log('Test Loss: %.3f | Acc: %.3f%% (%d/%d)' % (loss, acc, n, total))\n", 40) == (
        "log(\n    'Test Loss: %.3f | Acc: %.3f%% '\n    '(%d/%d)' % (loss, acc, n, total),\n)\n"
    )
    assert fitted('print(f"loss {loss:.4f} and a plain tail of words")\n', 30).splitlines()[2] == '    "plain tail of words",'


@pytest.mark.parametrize("code", [
    'message = "a string on the first line of its statement stays whole"\n',
    'print("\\N{GREEK SMALL LETTER ALPHA} names an escape with spaces in it")\n',
    'print("one, the first of two literals the user joined, stays as the user wrote it" "two")\n',
    'print("a_long_word_with_no_space_anywhere_in_it_at_all_to_split_it_at")\n',
])
def test_strings_that_cannot_split_stay_whole(code):
    assert ast.dump(ast.parse(fitted(code, 30))) == ast.dump(ast.parse(code))
    assert fitted(code, 30).count('"') == code.count('"')


def test_a_compound_header_opens_and_its_body_is_left_alone():
    out = fitted("""\
        with model.no_sync() if not (step % accumulation == 0) else contextlib.nullcontext():
            loss.backward()  # unchanged
    """, 60)
    assert out == (
        "with (\n"
        "    model.no_sync()\n"
        "    if not (step % accumulation == 0)\n"
        "    else contextlib.nullcontext()\n"
        "):\n"
        "    loss.backward()  # unchanged\n"
    )


def test_a_comprehension_puts_its_element_and_its_for_on_lines_of_their_own():
    assert fitted("nets = {key: DDP(net, device_ids=[LOCAL_RANK]) for key, net in nets.items()}\n", 50) == (
        "nets = {\n    key: DDP(net, device_ids=[LOCAL_RANK])\n    for key, net in nets.items()\n}\n"
    )


def test_a_line_that_fits_is_left_as_it_is():
    code = "loader = DataLoader(ds, batch_size=8)  # fits\n"
    assert fitted(code, 79) == code


@pytest.mark.parametrize("target", ["ddp", "dp", "fsdp"])
def test_converted_fixtures_stay_within_their_width(target):
    for path in FIXTURES:
        source = path.read_text()
        output = converted_file(path, target).output
        limit = width_limit(source)
        ast.parse(output)
        wide = [line for line in output.splitlines() if len(line) > limit]
        assert not wide, f"{path.name} --to {target}: {wide}"


DECORATED_ONE_LINER = """\
@torch.no_grad()
def evaluate(model, loader): return sum(model(x).argmax(1).eq(y).sum().item() for x, y in loader) / len(loader.dataset)
if ready: print("a header and its body on one line, too wide once converted", flush=True)
"""


def test_statements_are_laid_out_from_the_module_or_from_their_own_lines():
    """A wide line's statement is the module's CST node (the body of `if ready:` spread below it); a
    decorated one-line def, whose node starts at its decorator, is parsed from its own lines."""
    out, origins = fit_to_width(cst.parse_module(DECORATED_ONE_LINER), DECORATED_ONE_LINER, [1, 2, 3], 79,
                                ast.parse(DECORATED_ONE_LINER))
    assert out == textwrap.dedent("""\
        @torch.no_grad()
        def evaluate(model, loader):
            return sum(model(x).argmax(1).eq(y).sum().item() for x, y in loader) / len(
                loader.dataset,
            )
        if ready:
            print(
                "a header and its body on one line, too wide once converted",
                flush=True,
            )
        """)
    assert origins == [1, 2, 2, 2, 2, 3, 3, 3, 3, 3]
