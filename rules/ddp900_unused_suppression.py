"""DDP900: a suppression comment that suppresses nothing (off by default, like ruff's RUF100)."""

from __future__ import annotations

from ddpify.anatomy import Pos, ScriptKind
from ddpify.lint import Finding, Fix, Invalid, Rule
from ddpify.lint.cst_fixes import comment_edit
from ddpify.lint.suppress import ALL, Directive, directive_text


class UnusedSuppression(Rule, code="DDP900", name="unused-suppression", severity="warning"):
    """## What it does
    Flags a `# ddpify: ignore[CODE]` or `# ddpify: ignore` comment, and a ddpify code in a
    `# noqa: CODE` comment, that suppresses no finding of this run. A bare `# noqa` and other
    tools' codes in `# noqa: ...` are left alone: another linter may need them. Off by default (as
    ruff's RUF100); turn it on with `extend-select = ["DDP900"]` or `--extend-select DDP900`.
    A code whose rule is not enabled in this run suppresses nothing, so it counts as unused.

    ## Why is this bad?
    A stale suppression outlives the bug it excused: when the line changes and the mistake comes
    back, the comment hides it.

    ## Example
    ```python
    torch.save(model.module.state_dict(), "model.pt")  # ddpify: ignore[DDP008]
    ```

    ## Use instead
    ```python
    torch.save(model.module.state_dict(), "model.pt")
    ```

    ## Fix safety
    Safe: the fix deletes the directive (or the unused codes from its list), which changes no code.
    A directive followed by other comment text is reported without a fix.
    """

    message = "suppression comment that suppresses nothing"
    applies_to = frozenset(ScriptKind)
    default_enabled = False

    def check(self, anatomy):
        return ()  # judged by check_directives, once the other rules have run

    def check_directives(self, anatomy, unused: list[tuple[Directive, frozenset[str] | None]]):
        """Findings for the directives that suppressed nothing (the engine finds them)."""
        for directive, codes in unused:
            what = "suppression" if codes is ALL else f"suppression of {', '.join(sorted(codes))}"
            pos = Pos(directive.line, directive.col, directive.line, directive.end_col)
            yield Finding(pos, f"unused {what}: it suppresses no finding", _fix(anatomy, directive, codes))


def _fix(anatomy, directive: Directive, codes: frozenset[str] | None) -> Fix | None:
    """The directive's comment naming the codes still in use, or removed when none is."""
    if not directive.whole_comment:
        return None
    kept = frozenset() if codes is ALL or directive.codes is ALL else directive.codes - codes
    edit = comment_edit(anatomy, directive.line, directive.col, directive_text(directive, kept) if kept else "")
    if edit is None:
        return None
    return Fix((edit,), safe=True, description="drop the unused codes" if kept else "remove the comment")


_HEAD = """import torch
import torch.distributed as dist

dist.init_process_group("gloo")
"""

UnusedSuppression.VALID = (
    _HEAD + "x = 1  # noqa\ny = 2  # noqa: E501\nz = 3  # type: ignore\n",
)

# Used directives are tested in tests/test_lint_cli.py with every rule enabled: here DDP900 runs
# alone, so a directive naming any other code suppresses nothing.
UnusedSuppression.INVALID = (
    Invalid(_HEAD + "x = 1  # ddpify: ignore[DDP001]\n", line=5, fixed=_HEAD + "x = 1\n"),
    Invalid(_HEAD + "x = 1  # ddpify: ignore\n", line=5, fixed=_HEAD + "x = 1\n"),
    Invalid(_HEAD + "x = 1  # noqa: DDP006, E501\n", line=5, fixed=_HEAD + "x = 1  # noqa: E501\n"),
    Invalid(_HEAD + "x = 1  # ddpify: ignore[DDP001]  # why\n", line=5),
    Invalid(_HEAD + "x = max(\n\t1,  # ddpify: ignore[DDP001]\n\t2,\n)\n", line=6, fixed=_HEAD + "x = max(\n\t1,\n\t2,\n)\n"),
    Invalid((_HEAD + "x = 1\t# noqa: DDP006, E501\n").replace("\n", "\r\n"), line=5,
            fixed=(_HEAD + "x = 1\t# noqa: E501\n").replace("\n", "\r\n")),
)
