"""A review-ready Markdown summary of one conversion: what changed and why, warnings, and the diff."""

from __future__ import annotations

import difflib
from collections import OrderedDict

from ddpify.codemods.pipeline import Status

# Why each transform exists, for a reviewer who has not read ddpify's docs.
WHY = {
    "setup": "every process must join the process group and know its rank and GPU",
    "device": "each rank must use its own GPU, not all of them cuda:0",
    "wrap": "the model must be wrapped to run on every GPU (under DDP its gradients are then averaged)",
    "split": "every rank must draw the same train/validation split",
    "sampler": "each rank must train on its own shard of the data, reshuffled every epoch",
    "rank0": "side effects (printing, logging, saving) must happen once, not once per GPU",
    "module": "attributes of the wrapped model now live under `.module`",
    "batch-size": "the batch size is shared by the GPUs (per GPU or global, as chosen)",
    "no_sync": "with gradient accumulation, gradients need syncing only on the step that updates",
    "no_sync_discarded": "gradients that the next zero_grad clears unused need no all-reduce",
    "non-blocking": "a batch's copy to the GPU need not wait for the kernels already queued",
    "forward-device": "DataParallel scatters inputs itself; forward must not pin them to one device",
    "forward-state": "state set in forward on a replica is lost under DataParallel",
    "loss": "DataParallel returns one loss per GPU; they must be averaged",
}


def markdown_summary(path, result, target: str | None = None, *, locate=None, warnings=()) -> str:
    """Markdown for a pull request or review: per-transform changes (original line numbers),
    warnings, and the unified diff in a ```diff block.

    `locate(line) -> str` names a line (default `line N`; for a notebook, `cell 4:line 2` via
    `ddpify.notebooks.lint_location`); `warnings` are extra warnings (e.g. skipped IPython lines).
    """
    where = locate or (lambda line: f"line {line}")
    title = f"ddpify: `{path}`" + (f" → {target}" if target else "")
    out = [f"## {title}", "", f"**Status: {result.status.value}**" + (f": {result.reason}" if result.status is not Status.CONVERTED else ""), ""]
    if result.missing:
        out += [f"### Missing ({len(result.missing)}): to do by hand before this conversion is complete", ""]
        out += [f"- ❌ {where(m.line)}: {_inline(m.what)}; {_inline(m.todo)}" for m in result.missing]
        out.append("")
    if not result.changed and not result.advice and not warnings:
        return "\n".join(out)
    groups: OrderedDict[str, list] = OrderedDict()
    for change in sorted(result.changes, key=lambda c: c.line):
        groups.setdefault(change.transform, []).append(change)
    if groups:
        total = len(result.changes)
        out += [f"### Changes ({total} in {len(groups)} group{'s' if len(groups) != 1 else ''})", ""]
        for transform, changes in groups.items():
            why = WHY.get(transform)
            out.append(f"**{transform}**" + (f": {why}" if why else ""))
            out.append("")
            for change in changes:
                out.append(f"- {where(change.line)}: {_inline(change.message)}")
            out.append("")
    if result.advice or warnings:
        out += [f"### Warnings ({len(result.advice) + len(warnings)}): check these by hand", ""]
        for advice in sorted(result.advice, key=lambda a: a.line):
            out.append(f"- ⚠️ {where(advice.line)}: {_inline(advice.message)}")
        for warning in warnings:
            out.append(f"- ⚠️ {_inline(warning)}")
        out.append("")
    diff = unified_diff(path, result.source, result.output)
    if diff:
        fence = "```"
        while fence in diff:
            fence += "`"
        out += ["### Diff", "", f"{fence}diff", diff.rstrip("\n"), fence, ""]
    return "\n".join(out)


def _inline(text: str) -> str:
    return " ".join(text.split())


def unified_diff(path, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
