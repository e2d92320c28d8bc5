"""The code of a module, reusing the text of every statement that an earlier render already made.

A conversion renders the module after each stage of edits, and once more for the output; between
two renders only the statements the edits touched (and the blocks around them) are new nodes: LibCST
nodes are immutable, so every other statement is the same object and renders to the same text at
the same indentation. `Renderer.code` is `module.code`, letter for letter, at the cost of the new
statements only (tests/test_codegen.py compares the two over every fixture).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import libcst as cst
from libcst._nodes.base import CSTNode
from libcst._nodes.internal import CodegenState

_render_statement = CSTNode._codegen
_Known = tuple[tuple[str, ...], str, str]  # (indentation, text, last token) of a rendered statement
_NOTHING_TO_RECORD = nullcontext()


class _QuietState(CodegenState):
    """LibCST's codegen state where no positions are asked for: each node's `record_syntactic_position`
    is one shared context that records nothing, instead of one LibCST makes from a generator for every
    node rendered (a quarter of a module's codegen)."""

    def record_syntactic_position(self, node: CSTNode, *, start_node: CSTNode | None = None,
                                  end_node: CSTNode | None = None) -> nullcontext[None]:
        return _NOTHING_TO_RECORD


class _ReusingState(_QuietState):
    """LibCST's codegen state, with the texts of the statements rendered before and their last token."""

    def __init__(self, module: cst.Module, known: dict[cst.BaseStatement, _Known]) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.known = known
        self.reused_tail: tuple[str, str] | None = None  # the last reused text and the token it ends with

    def pop_trailing_newline(self) -> None:
        """Drop the file's last newline token, also when it ends a reused statement's text."""
        if self.reused_tail and self.tokens and self.tokens[-1] is self.reused_tail[0]:
            text, newline = self.reused_tail
            self.tokens[-1] = text[: len(text) - len(newline)]
            self.reused_tail = None
        else:
            super().pop_trailing_newline()


def _codegen(self: cst.BaseStatement, state: CodegenState, **kwargs: Any) -> None:
    """A statement's codegen: its earlier text where a renderer knows it at this indentation."""
    if not isinstance(state, _ReusingState):
        _render_statement(self, state, **kwargs)
        return
    indent = (state.default_indent, state.default_newline, *state.indent_tokens)
    known = state.known.get(self)
    if known is not None and known[0] == indent:
        state.tokens.append(known[1])
        state.reused_tail = known[1:]
        return
    start = len(state.tokens)
    _render_statement(self, state, **kwargs)
    if len(state.tokens) > start:
        state.known[self] = (indent, "".join(state.tokens[start:]), _last_token(state))


def _last_token(state: _ReusingState) -> str:
    """The last token rendered (a newline), also when it ends a reused text."""
    last = state.tokens[-1]
    return state.reused_tail[1] if state.reused_tail and last is state.reused_tail[0] else last


cst.BaseStatement._codegen = _codegen  # type: ignore[method-assign]


class Renderer:
    """Renders the modules of one conversion (one file's indentation and newline), reusing statement texts."""

    def __init__(self) -> None:
        self._known: dict[cst.BaseStatement, _Known] = {}

    def code(self, module: cst.Module) -> str:
        """`module.code`, made from the texts of the statements this renderer has rendered before."""
        state = _ReusingState(module, self._known)
        module._codegen(state)
        return "".join(state.tokens)


def code_of(module: cst.Module) -> str:
    """`module.code`, letter for letter, rendered without LibCST's position bookkeeping."""
    state = _QuietState(default_indent=module.default_indent, default_newline=module.default_newline)
    module._codegen(state)
    return "".join(state.tokens)
