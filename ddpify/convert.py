"""Convert a script's text to DDP or DataParallel: the one entry point for the CLI and verify.

The converted text is linted with ddpify's default rules: whatever they still find is a missing
item, so a conversion that ends "converted" always lints clean.
"""

from __future__ import annotations

import ast
import os

from ddpify.anatomy import Anatomy, ScriptKind, analyze
from ddpify.anatomy.facts import NO_FACTS, ProjectFacts
from ddpify.codemods.options import Options
from ddpify.codemods.pipeline import ConversionResult, run_pipeline
from ddpify.codemods.report import Missing
from ddpify.collector import FEWER_COLLECTIONS

TARGETS = ("ddp", "dp", "fsdp", "accelerate")
NO_TRAINING = "no training found"
ALREADY_DISTRIBUTED = "already distributed"


def convert_source(text: str, target: str, *, path: str = "<string>", batch_size: str = "per-gpu",
                   facts: ProjectFacts = NO_FACTS, library: bool = False, eval: str = "shard",
                   log_loss: str = "reduced", checkpoint: str = "full", mixed_precision: str = "keep",
                   anatomy: Anatomy | None = None) -> ConversionResult:
    """The converted text, the changes (original line numbers) and advice for the user.

    `facts` is what the file's project says about it (ddpify.project_conversion); a `library` is a module the
    entry script imports: it never joins the process group itself. `eval` (shard or whole) and
    `log_loss` (reduced or rank0) choose how evaluation and training-loss prints are converted;
    `checkpoint` (full or sharded) and `mixed_precision` (keep or policy) how --to fsdp saves
    checkpoints and treats autocast. `anatomy`: the text's analysis with these facts where the
    caller has made it (the project layer has), so that it is not made again.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    with FEWER_COLLECTIONS:  # a conversion's trees live as long as its stage
        anatomy = anatomy or analyze(text, path, facts=facts)
        reason = _nothing_to_do(anatomy, target, facts)
        if reason:
            return ConversionResult(source=text, output=text, note=reason)
        options = Options(batch_size=batch_size, eval=eval, log_loss=log_loss, checkpoint=checkpoint, mixed_precision=mixed_precision)
        return run_pipeline(text, path, _transforms(target, library), options, facts, owns_duties=not library, anatomy=anatomy,
                            fit_width=True, check=lint_leftovers)


def convert_notebook(path, target: str = "dp", **options):
    """(new notebook, ConversionResult, CellMap): its code cells joined, converted and put back; the
    result's lines are lines of the joined script. `path`: a notebook's path, or the notebook itself;
    `options` are convert_source's (batch_size, eval, log_loss, checkpoint, mixed_precision)."""
    from ddpify.notebooks import notebook_to_script, read_notebook, rebuild_notebook  # nbformat: only for notebooks

    nb = read_notebook(path) if isinstance(path, (str, os.PathLike)) else path
    text, cell_map = notebook_to_script(nb)
    result = convert_source(text, target, path=str(path), **options)
    return rebuild_notebook(nb, result.output, cell_map), result, cell_map


def lint_leftovers(result: ConversionResult, tree: ast.Module, path: str) -> list[Missing]:
    """What ddpify's default lint rules still find in the output (`tree` its parse), unless a missing
    item already names that line."""
    from ddpify.lint.engine import check_text, rule_set
    from ddpify.lint.registry import all_rules

    findings, _ = check_text(result.output, path, rule_set(frozenset(r.code for r in all_rules() if r.default_enabled)), tree)
    named = {m.line for m in result.missing}
    leftovers = []
    for finding in findings:
        line = result.original_line(finding.pos.line)
        if line not in named:
            named.add(line)
            leftovers.append(Missing(line, f"ddpify lint still finds {finding.code} ({finding.name}): {finding.message}",
                                     f"fix it by hand (`ddpify rule {finding.code}` explains how)"))
    return leftovers


def _nothing_to_do(anatomy: Anatomy, target: str, facts: ProjectFacts) -> str:
    kind = anatomy.kind
    if kind is ScriptKind.NOT_TORCH and not facts:  # a project module may handle torch objects without importing torch
        return "does not use torch"
    if kind.by_a_library:
        label, call = anatomy.framework  # type: ignore[misc]
        return f"{ALREADY_DISTRIBUTED} by {label} ({call.qualname} at line {call.line}); nothing to do"
    if kind.distributed:
        return f"{ALREADY_DISTRIBUTED} (DDP); nothing to do"
    if kind is ScriptKind.DATA_PARALLEL and target == "dp":
        return "already uses DataParallel; nothing to do"
    if not anatomy.trains and not facts:
        return f"{NO_TRAINING} (no optimizer, backward() or optimizer step); nothing to do"
    return ""


def _transforms(target: str, library: bool):
    if target == "ddp":
        from ddpify.codemods.ddp import DDP_LIBRARY_TRANSFORMS, DDP_TRANSFORMS

        return DDP_LIBRARY_TRANSFORMS if library else DDP_TRANSFORMS
    if target == "fsdp":
        from ddpify.codemods.fsdp import FSDP_LIBRARY_TRANSFORMS, FSDP_TRANSFORMS

        return FSDP_LIBRARY_TRANSFORMS if library else FSDP_TRANSFORMS
    if target == "accelerate":
        from ddpify.codemods.accelerate import ACCELERATE_LIBRARY_TRANSFORMS, ACCELERATE_TRANSFORMS

        return ACCELERATE_LIBRARY_TRANSFORMS if library else ACCELERATE_TRANSFORMS
    from ddpify.codemods.dp import DP_TRANSFORMS

    return DP_TRANSFORMS
